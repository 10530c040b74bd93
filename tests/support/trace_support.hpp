// Traces made up by tests.
#pragma once

#include <utility>
#include <vector>

#include "fragctl/trace.hpp"

namespace fragctl::testing {

/// A trace named "hand-made" in fragctl's CSV format holding `events`.
inline trace hand_made_trace(std::vector<trace_event> events) {
  trace t;
  t.name = "hand-made";
  t.format = "fragctl-csv";
  t.events = std::move(events);
  return t;
}

}  // namespace fragctl::testing
