// Hung collectives as text and HTML (report/hangs.hpp).
#include "report/hangs.hpp"

#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "report/render_util.hpp"
#include "util/strings.hpp"

namespace fragctl::report_detail {

namespace {

using util::printable;

std::string ranks_text(const std::vector<std::int64_t>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

std::string timeout_text(const hang_note& h) {
  std::string out = fmt::format("fragctl's deadline {:g} s", h.deadline_s);
  if (h.group_timeout_s) out += fmt::format(", the process group's timeout {:g} s", *h.group_timeout_s);
  return out;
}

std::string modules_text(const hang_note& h) {
  std::string out = h.modules.empty() ? std::string("-") : fmt::format("{}", fmt::join(h.modules, ", "));
  if (h.bytes > 0) {
    out += "; ";
    out += bytes(h.bytes);
    out += h.collective == "reduce_scatter" ? " reduced" : " gathered";
  }
  return out;
}

}  // namespace

std::string hang_headline(const hang_note& h) {
  std::string out = fmt::format("{} #{} of {}", h.collective, h.sequence, h.block);
  if (!h.communicator.empty()) out += fmt::format(" ({})", h.communicator);
  if (h.timed_out) {
    out += fmt::format(" passed fragctl's deadline of {:g} s after {:.1f} s", h.deadline_s, h.elapsed_s);
  } else {
    out += fmt::format(" failed after {:.1f} s", h.elapsed_s);
  }
  if (!h.missing.empty()) {
    out += "; ";
    out += ranks_text(h.missing);
    out += " had not entered it";
  } else if (!h.peers.empty()) {  // no one missing: what the first other rank did (gave up, diverged)
    out += "; ";
    out += h.peers.front();
  }
  return out;
}

void hangs_text(std::string& out, const std::vector<hang_note>& hangs) {
  if (hangs.empty()) return;
  out += fmt::format("\nHangs: {} (collectives that passed their deadline or failed)\n", hangs.size());
  for (const hang_note& h : hangs) {
    out += fmt::format("  rank {}: {}\n", h.rank, printable(hang_headline(h)));
    for (const std::string& peer : h.peers) out += fmt::format("    {}\n", printable(peer));
    out += fmt::format("    modules: {}\n", printable(modules_text(h)));
    out += fmt::format("    {}\n", timeout_text(h));
  }
}

void hangs_html(markup& out, const std::vector<hang_note>& hangs) {
  if (hangs.empty()) return;
  out.emit("<h3>Hangs ({})</h3>\n<ul class=\"oom-list\">\n", hangs.size());
  for (const hang_note& h : hangs) {
    out.emit("<li>rank {}: {}<ul>\n", h.rank, hang_headline(h));
    for (const std::string& peer : h.peers) out.emit("<li>{}</li>\n", peer);
    out.emit("<li>modules: {}</li>\n<li>{}</li>\n</ul></li>\n", modules_text(h), timeout_text(h));
  }
  out.emit("</ul>\n");
}

nlohmann::ordered_json hangs_json(const std::vector<hang_note>& hangs) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const hang_note& h : hangs) {
    out.push_back({{"collective", h.collective},
                   {"sequence", h.sequence},
                   {"block", h.block},
                   {"timed_out", h.timed_out},
                   {"deadline_s", h.deadline_s},
                   {"elapsed_s", h.elapsed_s},
                   {"missing", h.missing},
                   {"peers", h.peers}});
  }
  return out;
}

void rank_hang_lines(std::string& out, const std::vector<run_report>& runs) {
  std::vector<const run_report*> with;
  std::set<std::string> sources;
  for (const run_report& r : runs) {
    if (!r.hangs.empty() && sources.insert(r.source).second) with.push_back(&r);
  }
  if (with.empty()) return;
  std::stable_sort(with.begin(), with.end(), [](const run_report* a, const run_report* b) {
    return a->writer.rank.value_or(-1) < b->writer.rank.value_or(-1);
  });
  out +=
      "\nHangs (collectives that passed their deadline or failed; `fragctl report FILE` shows where every rank was)\n";
  for (const run_report* r : with) {
    for (const hang_note& h : r->hangs) {
      out += fmt::format("  rank {}: {}\n", r->writer.rank ? *r->writer.rank : h.rank, printable(hang_headline(h)));
    }
  }
}

}  // namespace fragctl::report_detail
