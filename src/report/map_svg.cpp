// The memory map picture.
//
// Layout. Reserved memory is drawn as rows of a fixed number of bytes
// (a power of two chosen so that the largest segment fits in one row and the
// whole map takes at most about 48 rows); segments are packed into rows in
// address order, each starting a new row when it does not fit in what is
// left of the current one. Widths are proportional to bytes, so the picture
// shows where the bytes are: a thin sliver is a small block. Blocks too thin
// to see (under one pixel) that follow each other with the same use are
// merged into one cluster rectangle whose tooltip counts them, which keeps
// the SVG small for maps of many thousands of blocks.
#include <algorithm>
#include <bit>
#include <iterator>

#include "fmt/format.h"
#include "report/markup.hpp"
#include "report/render_util.hpp"
#include "report/svg.hpp"

namespace fragctl {

const std::vector<size_class>& map_size_classes() {
  static const std::vector<size_class> classes = {
      {64 * KiB, "< 64 KiB", "#6a3d9a"},        {MiB, "64 KiB - 1 MiB", "#1f78b4"},
      {16 * MiB, "1 - 16 MiB", "#33a02c"},      {128 * MiB, "16 - 128 MiB", "#ff7f00"},
      {GiB, "128 MiB - 1 GiB", "#e31a1c"},      {SIZE_MAX, ">= 1 GiB", "#8c510a"},
  };
  return classes;
}

namespace report_detail {

namespace {

constexpr double margin_left = 90;
constexpr double margin_right = 10;
constexpr double header_height = 28;
constexpr double legend_height = 46;
constexpr double min_block_px = 1.0;
constexpr std::size_t target_rows = 48;

std::size_t class_index(std::size_t bytes) {
  const auto& classes = map_size_classes();
  for (std::size_t i = 0; i < classes.size(); ++i)
    if (bytes < classes[i].below) return i;
  return classes.size() - 1;
}

std::size_t row_bytes_for(const memory_snapshot& m) {
  std::size_t largest = 0;
  for (const memory_segment& s : m.segments) largest = std::max(largest, s.size);
  const std::size_t wanted = std::max(largest, m.reserved_bytes() / target_rows);
  // A damaged report's segment can claim up to 2^64 - 1 bytes, whose power of
  // two is not representable (std::bit_ceil's undefined case): rows then hold
  // 2^63 bytes and the one segment overflows its row.
  constexpr std::size_t largest_row = std::size_t{1} << 63;
  if (wanted > largest_row) return largest_row;
  return std::bit_ceil(std::max<std::size_t>(wanted, 2 * MiB));
}

struct placed_segment {
  const memory_segment* segment;
  std::size_t row;
  std::size_t offset;  // bytes from the row's start
};

class map_writer {
 public:
  map_writer(const memory_snapshot& m, const map_options& o, std::string id)
      : map_(m), options_(o), row_bytes_(row_bytes_for(m)), pending_fill_(fmt::format("url(#{}-pending)", id)),
        id_(std::move(id)) {
    std::size_t row = 0;
    std::size_t used = 0;
    for (const memory_segment& s : m.segments) {
      if (used > 0 && s.size > row_bytes_ - used) {
        ++row;
        used = 0;
      }
      if (row >= o.max_rows) {
        ++omitted_;
        omitted_bytes_ += s.size;
        continue;
      }
      placed_.push_back({&s, row, used});
      used += s.size;
      rows_ = row + 1;
    }
  }

  [[nodiscard]] double width() const { return margin_left + options_.width + margin_right; }
  [[nodiscard]] double height() const {
    return header_height + static_cast<double>(rows_) * options_.row_height + (omitted_ > 0 ? 16 : 0) + legend_height;
  }

  markup draw(const std::string& label, bool standalone) {
    markup out;
    out.emit(
        "<svg {}class=\"memory-map\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
        "data-segments=\"{}\" data-blocks=\"{}\" data-row-bytes=\"{}\" font-family=\"sans-serif\" "
        "font-size=\"11\">\n",
        standalone ? constant_markup("xmlns=\"http://www.w3.org/2000/svg\" ") : constant_markup(""), width(), height(),
        width(), height(), map_.segments.size(), map_.block_count(), row_bytes_);
    if (standalone) {
      out.emit(
          "<style>.block:hover{{stroke:#000;stroke-width:1}}.segment{{fill:none;stroke:#455a64;stroke-width:0.6}}"
          "text{{fill:#263238}}</style>\n");
    }
    out.emit(
        "<defs><pattern id=\"{}-pending\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
        "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#fff3c4\"/><line x1=\"0\" y1=\"0\" "
        "x2=\"0\" y2=\"6\" stroke=\"#f9a825\" stroke-width=\"3\"/></pattern></defs>\n",
        id_);
    out.emit(
        "<text class=\"map-title\" x=\"{}\" y=\"16\" font-size=\"13\">{}{}{} segment{}, {} reserved: {} live, "
        "{} free, {} pending; one row = {}</text>\n",
        margin_left, label, label.empty() ? "" : " \u2014 ", map_.segments.size(), map_.segments.size() == 1 ? "" : "s",
        bytes(map_.reserved_bytes()), bytes(map_.bytes(block_use::live)), bytes(map_.bytes(block_use::free)),
        bytes(map_.bytes(block_use::pending)), bytes(row_bytes_));
    for (std::size_t r = 0; r < rows_; ++r) {
      out.emit("<text class=\"row-label\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", margin_left - 6,
               y_of(r) + options_.row_height * 0.75, bytes(r * row_bytes_));
    }
    for (const placed_segment& p : placed_) segment(out, p);
    double y = header_height + static_cast<double>(rows_) * options_.row_height;
    if (omitted_ > 0) {
      out.emit("<text class=\"omitted\" x=\"{}\" y=\"{:.1f}\">{} more segments ({}) not drawn</text>\n", margin_left,
               y + 12, omitted_, bytes(omitted_bytes_));
      y += 16;
    }
    legend(out, y + 8);
    out.emit("</svg>\n");
    return out;
  }

 private:
  [[nodiscard]] double y_of(std::size_t row) const {
    return header_height + static_cast<double>(row) * options_.row_height;
  }
  [[nodiscard]] double px(std::size_t bytes_in_row) const {
    return static_cast<double>(bytes_in_row) / static_cast<double>(row_bytes_) * options_.width;
  }

  void segment(markup& out, const placed_segment& p) {
    const memory_segment& s = *p.segment;
    const double x0 = margin_left + px(p.offset);
    const double y = y_of(p.row) + 1;
    const double h = options_.row_height - 2;
    out.emit(
        "<g class=\"segment-group\" data-address=\"{:#x}\" data-size=\"{}\" data-pool=\"{}\" data-stream=\"{}\">\n",
        s.address, s.size, s.pool, stream_name(s.stream));
    // Free space shows where no block covers the segment (blocks omitted too).
    out.emit(
        "<rect class=\"segment-free\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" "
        "fill=\"#eceff1\"/>\n",
        x0, y, std::max(px(s.size), 0.5), h);
    std::size_t i = 0;
    while (i < s.blocks.size()) {
      const memory_block& b = s.blocks[i];
      const double x = x0 + px(static_cast<std::size_t>(b.address - s.address));
      if (px(b.size) >= min_block_px) {
        block(out, b, x, y, px(b.size), h);
        ++i;
        continue;
      }
      // A run of thin blocks of the same use becomes one cluster.
      std::size_t j = i;
      std::size_t total = 0;
      std::size_t largest = 0;
      while (j < s.blocks.size() && s.blocks[j].use == b.use && px(s.blocks[j].size) < min_block_px) {
        total += s.blocks[j].size;
        largest = std::max(largest, s.blocks[j].size);
        ++j;
      }
      if (j - i == 1) {
        block(out, b, x, y, std::max(px(b.size), 0.5), h);
      } else {
        cluster(out, b.use, j - i, total, largest, x, y, std::max(px(total), 0.5), h);
      }
      i = j;
    }
    out.emit(
        "<rect class=\"segment\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"none\" "
        "stroke=\"#455a64\" stroke-width=\"0.6\"><title>segment {:#x}: {} ({} pool, stream {})</title></rect>\n"
        "</g>\n",
        x0, y, std::max(px(s.size), 0.5), h, s.address, bytes(s.size), s.pool.empty() ? "-" : s.pool,
        stream_name(s.stream));
  }

  [[nodiscard]] std::string fill_of(block_use use, std::size_t size) const {
    switch (use) {
      case block_use::live:
        return std::string(map_size_classes()[class_index(size)].colour);
      case block_use::pending:
        return pending_fill_;
      case block_use::free:
        break;
    }
    return "#eceff1";
  }

  void block(markup& out, const memory_block& b, double x, double y, double w, double h) const {
    const std::string use(to_string(b.use));
    out.emit(
        "<rect class=\"block {}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" "
        "data-address=\"{:#x}\" data-size=\"{}\" data-requested=\"{}\" data-stream=\"{}\"><title>{} block "
        "{:#x}: {}{}, stream {}</title></rect>\n",
        use, x, y, w, h, fill_of(b.use, b.size), b.address, b.size, b.requested, stream_name(b.stream), use, b.address,
        bytes(b.size), b.use == block_use::live ? fmt::format(" (requested {})", bytes(b.requested)) : "",
        stream_name(b.stream));
  }

  void cluster(markup& out, block_use use, std::size_t count, std::size_t total, std::size_t largest, double x,
               double y, double w, double h) const {
    const std::string name(to_string(use));
    out.emit(
        "<rect class=\"block cluster {}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" "
        "fill=\"{}\" data-blocks=\"{}\" data-size=\"{}\"><title>{} {} blocks, {} in all (largest {})</title>"
        "</rect>\n",
        name, x, y, w, h, fill_of(use, largest), count, total, count, name, bytes(total), bytes(largest));
  }

  void legend(markup& out, double y) const {
    out.emit("<g class=\"legend\" transform=\"translate({},{:.1f})\">\n", margin_left, y);
    double x = 0;
    double row_y = 0;
    const auto item = [&](std::string_view label, std::string_view fill, std::string_view kind) {
      const double w = 18 + 6.2 * static_cast<double>(label.size()) + 14;
      if (x + w > options_.width) {
        x = 0;
        row_y += 18;
      }
      out.emit(
          "<g class=\"legend-item\" data-kind=\"{}\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" "
          "height=\"12\" fill=\"{}\" stroke=\"#455a64\" stroke-width=\"0.5\"/><text x=\"{:.1f}\" "
          "y=\"{:.1f}\">{}</text></g>\n",
          kind, x, row_y, fill, x + 16, row_y + 10, label);
      x += w;
    };
    for (const size_class& c : map_size_classes()) item(fmt::format("live {}", c.label), c.colour, "live");
    item("free (cached)", "#eceff1", "free");
    item("pending (freed on another stream)", pending_fill_, "pending");
    out.emit("</g>\n");
  }

  const memory_snapshot& map_;
  const map_options& options_;
  std::size_t row_bytes_;
  std::vector<placed_segment> placed_;
  std::size_t rows_ = 0;
  std::size_t omitted_ = 0;
  std::size_t omitted_bytes_ = 0;
  std::string pending_fill_;
  std::string id_;
};

}  // namespace

markup map_svg(const labelled_map& m, const map_options& options, bool standalone, std::string_view id) {
  map_writer writer(m.map, options, std::string(id));
  return writer.draw(m.label, standalone);
}

}  // namespace report_detail

std::string render_map_svg(const labelled_map& m, const map_options& options) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + report_detail::map_svg(m, options, true, "map").str();
}

}  // namespace fragctl
