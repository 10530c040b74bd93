// A small reader of fragctl's CSV trace (action,addr,size,stream,time_us;
// docs/traces.md), plain or gzip-compressed, for torch_replay, which is built
// against PyTorch rather than fragctl. Keeps `alloc` and `free_requested`
// rows as fragctl's reader does and counts the rest.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace torch_replay {

struct event {
  bool alloc;
  std::uint64_t addr;
  std::size_t size;
  std::uint64_t stream;
  std::int64_t time_us;
};

struct trace {
  std::string name;
  std::vector<event> events;
  std::uint64_t ignored_rows = 0;
};

/// "dir/gpt2m.trace.csv.gz" -> "gpt2m", as fragctl names traces.
inline std::string trace_name(std::string_view path) {
  if (const auto slash = path.rfind('/'); slash != std::string_view::npos) path.remove_prefix(slash + 1);
  for (bool changed = true; changed;) {
    changed = false;
    for (const std::string_view suffix : {".gz", ".csv", ".json", ".trace"}) {
      if (path.size() > suffix.size() && path.substr(path.size() - suffix.size()) == suffix) {
        path.remove_suffix(suffix.size());
        changed = true;
      }
    }
  }
  return std::string(path);
}

/// Reads a trace; throws std::runtime_error "<path>:<line>: <what>".
inline trace read_trace(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error(path + ": cannot open");
  trace t;
  t.name = trace_name(path);
  std::string line;
  char buf[4096];
  std::size_t line_no = 0;
  const auto fail = [&](const std::string& what) {
    gzclose(f);
    throw std::runtime_error(path + ":" + std::to_string(line_no) + ": " + what);
  };
  while (gzgets(f, buf, sizeof buf) != nullptr) {
    line += buf;
    if (line.empty() || (line.back() != '\n' && !gzeof(f))) continue;
    ++line_no;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line_no == 1) {
      if (line.rfind("action,addr,size,stream", 0) != 0) fail("not a fragctl CSV trace (header " + line + ")");
      line.clear();
      continue;
    }
    if (line.empty()) continue;
    if (line[0] == '#') {  // a comment (docs/traces.md)
      line.clear();
      continue;
    }
    std::vector<std::string> cells;
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = line.find(',', start);
      cells.push_back(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (cells.size() < 5) fail("expected 5 columns");
    const std::string& action = cells[0];
    const bool alloc = action == "alloc";
    if (!alloc && action != "free_requested") {
      ++t.ignored_rows;
      line.clear();
      continue;
    }
    char* end = nullptr;
    event e{alloc, 0, 0, 0, 0};
    e.addr = std::strtoull(cells[1].c_str(), &end, 10);
    if (*end != '\0') fail("bad addr");
    e.size = std::strtoull(cells[2].c_str(), &end, 10);
    if (*end != '\0') fail("bad size");
    e.stream = std::strtoull(cells[3].c_str(), &end, 10);
    if (*end != '\0') fail("bad stream");
    e.time_us = std::strtoll(cells[4].c_str(), &end, 10);
    if (*end != '\0') fail("bad time_us");
    t.events.push_back(e);
    line.clear();
  }
  const bool truncated = gzeof(f) == 0;
  gzclose(f);
  if (truncated) throw std::runtime_error(path + ": read error or corrupt gzip data after line " + std::to_string(line_no));
  if (line_no == 0) throw std::runtime_error(path + ": empty file");
  return t;
}

}  // namespace torch_replay
