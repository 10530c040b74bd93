// Hung collectives in reports (docs/reports.md, "Hangs"): the records a
// rank's JSON report carries under "hangs" (run_report::hangs), as text, as
// HTML, and as a line per rank under the rank table.
#pragma once

#include <string>
#include <vector>

#include "fragctl/run_report.hpp"
#include "nlohmann/json.hpp"
#include "report/markup.hpp"

namespace fragctl::report_detail {

/// "all_gather #41 of block 3 'layers.2' (nccl) passed fragctl's deadline of
/// 3.2 s after 3.3 s; rank 1 had not entered it" (text, not yet printable()).
[[nodiscard]] std::string hang_headline(const hang_note& h);

/// The "Hangs" section of render_text: each hang's headline, where every
/// other rank was, the block's modules and bytes, the deadline against the
/// group's timeout. Nothing without hangs.
void hangs_text(std::string& out, const std::vector<hang_note>& hangs);

/// The same as an HTML section of a run.
void hangs_html(markup& out, const std::vector<hang_note>& hangs);

/// Under the rank table: a line per rank whose report recorded a hang
/// (each report file once). Nothing when none did.
void rank_hang_lines(std::string& out, const std::vector<run_report>& runs);

/// The hangs as render_rank_json writes them: a list of {"collective",
/// "sequence", "block", "timed_out", "deadline_s", "elapsed_s", "missing",
/// "peers"}.
[[nodiscard]] nlohmann::ordered_json hangs_json(const std::vector<hang_note>& hangs);

}  // namespace fragctl::report_detail
