// Traces made up by tests, and those of the test data.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fragctl/trace.hpp"
#include "support/test_support.hpp"

namespace fragctl::testing {

/// A trace named "hand-made" in fragctl's CSV format holding `events`.
inline trace hand_made_trace(std::vector<trace_event> events) {
  trace t;
  t.name = "hand-made";
  t.format = "fragctl-csv";
  t.events = std::move(events);
  return t;
}

/// The trace `file` of the test data (tests/data), read; throws if it cannot be.
inline trace test_data_trace(const std::string& file) {
  auto t = read_trace(test_data(file));
  if (!t.ok()) throw std::runtime_error(std::string(t.status().message()));
  return *std::move(t);
}

}  // namespace fragctl::testing
