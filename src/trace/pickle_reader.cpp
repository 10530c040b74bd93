// The plain-data pickle machine; see pickle_reader.hpp for the theory and
// pickle_opcodes.hpp for the opcodes.
#include "trace/pickle_reader.hpp"

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "fmt/format.h"
#include "trace/pickle_opcodes.hpp"

namespace fragctl::trace_detail {

namespace {

using json = nlohmann::json;
using namespace pickle_opcode;  // NOLINT(google-build-using-namespace): the opcode names

// Raised inside the machine, turned into a status by read_pickle.
struct pickle_error {
  std::string what;
};

enum class kind : std::uint8_t { none, boolean, negative, non_negative, real, text, list, tuple, dict };

// text: `value` is the offset of its bytes in the input, `aux` their length.
// list, tuple, dict: `aux` indexes machine::items_ (a dict holds key, value
// pairs). Scalars keep their value in `value`.
struct node {
  std::uint64_t value = 0;
  std::uint32_t aux = 0;
  kind k = kind::none;
};

class machine {
 public:
  machine(std::string_view content, std::string_view file) : in_(content), file_(file) {}

  /// Runs the pickle to STOP; returns the node left on top of the stack.
  std::uint32_t run() {
    for (;;) {
      if (pos_ >= in_.size()) fail_at(pos_, "the pickle ends before its STOP opcode (truncated)");
      at_ = pos_;
      const auto code = static_cast<std::uint8_t>(in_[pos_++]);
      if (code == STOP) return pop("STOP");
      step(code);
    }
  }

  json to_json(std::uint32_t root, const pickle_options& options) {
    options_ = &options;
    limit_ = options.max_output_bytes != 0 ? options.max_output_bytes : 16 * in_.size() + (64u << 20);
    json out;
    convert(root, 0, out);
    return out;
  }

 private:
  [[noreturn]] void fail_at(std::size_t offset, std::string_view what) const {
    throw pickle_error{fmt::format("{}: pickle byte {}: {}", file_, offset, what)};
  }
  [[noreturn]] void fail(std::string_view what) const { fail_at(at_, what); }
  [[noreturn]] void fail_result(std::string_view what) const {
    throw pickle_error{fmt::format("{}: pickle: {}", file_, what)};
  }

  std::uint64_t read_le(std::size_t n) {
    if (in_.size() - pos_ < n)
      fail(fmt::format("opcode 0x{:02x} needs {} bytes of argument; the pickle is truncated", code_at(), n));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t{static_cast<std::uint8_t>(in_[pos_ + i])} << (8 * i);
    pos_ += n;
    return v;
  }
  std::uint8_t code_at() const noexcept { return static_cast<std::uint8_t>(in_[at_]); }

  // The argument of a length-prefixed opcode: `length` bytes, skipped.
  std::size_t take(std::uint64_t length) {
    if (length > in_.size() - pos_)
      fail(
          fmt::format("opcode 0x{:02x} announces {} bytes, only {} remain; "
                      "the pickle is truncated",
                      code_at(), length, in_.size() - pos_));
    const std::size_t start = pos_;
    pos_ += static_cast<std::size_t>(length);
    return start;
  }

  std::uint32_t add(node n) {
    if (nodes_.size() >= std::numeric_limits<std::uint32_t>::max()) fail("too many values");
    nodes_.push_back(n);
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  void push(std::uint32_t id) { stack_.push_back(id); }
  void push_node(kind k, std::uint64_t value = 0) { push(add(node{value, 0, k})); }
  void push_integer(std::int64_t v) {
    push_node(v < 0 ? kind::negative : kind::non_negative, static_cast<std::uint64_t>(v));
  }
  void push_text(std::uint64_t length) {
    const std::size_t start = take(length);
    if (length > std::numeric_limits<std::uint32_t>::max()) fail("a string longer than 4 GiB");
    push(add(node{start, static_cast<std::uint32_t>(length), kind::text}));
  }
  std::uint32_t new_container(kind k, std::vector<std::uint32_t> items = {}) {
    items_.push_back(std::move(items));
    return add(node{0, static_cast<std::uint32_t>(items_.size() - 1), k});
  }

  // The stack above the innermost MARK is all an opcode may use.
  std::size_t base() const noexcept { return marks_.empty() ? 0 : marks_.back(); }
  std::uint32_t top(const char* opcode) const {
    if (stack_.size() <= base()) fail(fmt::format("{} with nothing on the stack", opcode));
    return stack_.back();
  }
  std::uint32_t pop(const char* opcode) {
    const std::uint32_t id = top(opcode);
    stack_.pop_back();
    return id;
  }
  std::vector<std::uint32_t> pop_mark(const char* opcode) {
    if (marks_.empty()) fail(fmt::format("{} without a MARK", opcode));
    const std::size_t from = marks_.back();
    marks_.pop_back();
    std::vector<std::uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(from), stack_.end());
    stack_.resize(from);
    return items;
  }
  std::vector<std::uint32_t>& target(const char* opcode, kind want) {
    const node& n = nodes_[top(opcode)];
    if (n.k != want) fail(fmt::format("{} on a {}, not a {}", opcode, kind_name(n.k), kind_name(want)));
    return items_[n.aux];
  }
  static const char* kind_name(kind k) noexcept {
    switch (k) {
      case kind::none:
        return "None";
      case kind::boolean:
        return "bool";
      case kind::negative:
      case kind::non_negative:
        return "int";
      case kind::real:
        return "float";
      case kind::text:
        return "str";
      case kind::list:
        return "list";
      case kind::tuple:
        return "tuple";
      case kind::dict:
        return "dict";
    }
    return "value";
  }

  void memo_put(std::uint64_t index, const char* opcode) { memo_[index] = top(opcode); }
  void memo_get(std::uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail(fmt::format("memo index {} was never stored", index));
    push(it->second);
  }

  void push_long(std::uint64_t length) {
    const std::size_t start = take(length);
    const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(in_[start + i]); };
    const std::size_t n = static_cast<std::size_t>(length);
    if (n == 0) return push_integer(0);
    const bool negative = (byte(n - 1) & 0x80) != 0;
    for (std::size_t i = 8; i < n; ++i)
      if (byte(i) != (negative ? 0xff : 0x00)) fail("an integer outside the 64-bit range");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < std::min<std::size_t>(n, 8); ++i) v |= std::uint64_t{byte(i)} << (8 * i);
    if (negative && n < 8) v |= ~std::uint64_t{0} << (8 * n);
    if (negative && (v >> 63) == 0) fail("an integer outside the 64-bit range");
    push_node(negative ? kind::negative : kind::non_negative, v);
  }

  void step(std::uint8_t code) {
    switch (code) {
      case PROTO: {
        const std::uint64_t version = read_le(1);
        if (version < 2 || version > 5) fail(fmt::format("pickle protocol {}: protocols 2 to 5 are read", version));
        return;
      }
      case FRAME: {  // a frame only announces the length of what follows
        const std::uint64_t length = read_le(8);
        if (length > in_.size() - pos_)
          fail(fmt::format("FRAME of {} bytes, only {} remain; the pickle is truncated", length, in_.size() - pos_));
        return;
      }
      case MARK:
        marks_.push_back(stack_.size());
        return;
      case POP:
        if (stack_.size() > base())
          stack_.pop_back();
        else
          pop_mark("POP");
        return;
      case POP_MARK:
        pop_mark("POP_MARK");
        return;
      case DUP:
        push(top("DUP"));
        return;
      case NONE:
        push_node(kind::none);
        return;
      case NEWTRUE:
        push_node(kind::boolean, 1);
        return;
      case NEWFALSE:
        push_node(kind::boolean, 0);
        return;
      case BININT:
        push_integer(static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4))));
        return;
      case BININT1:
        push_integer(static_cast<std::int64_t>(read_le(1)));
        return;
      case BININT2:
        push_integer(static_cast<std::int64_t>(read_le(2)));
        return;
      case LONG1:
        push_long(read_le(1));
        return;
      case LONG4: {
        const auto n = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4)));
        if (n < 0) fail("LONG4 with a negative length");
        push_long(static_cast<std::uint64_t>(n));
        return;
      }
      case BINFLOAT:
        push_node(kind::real, __builtin_bswap64(read_le(8)));
        return;  // big-endian
      case SHORT_BINUNICODE:
      case SHORT_BINSTRING:
      case SHORT_BINBYTES:
        push_text(read_le(1));
        return;
      case BINUNICODE:
      case BINBYTES:
        push_text(read_le(4));
        return;
      case BINSTRING: {
        const auto n = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4)));
        if (n < 0) fail("BINSTRING with a negative length");
        push_text(static_cast<std::uint64_t>(n));
        return;
      }
      case BINUNICODE8:
      case BINBYTES8:
      case BYTEARRAY8:
        push_text(read_le(8));
        return;
      case EMPTY_DICT:
        push(new_container(kind::dict));
        return;
      case EMPTY_LIST:
        push(new_container(kind::list));
        return;
      case EMPTY_TUPLE:
        push(new_container(kind::tuple));
        return;
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        const std::size_t n = code - TUPLE1 + 1;
        if (stack_.size() - base() < n) fail(fmt::format("TUPLE{} with fewer than {} values on the stack", n, n));
        std::vector<std::uint32_t> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        push(new_container(kind::tuple, std::move(items)));
        return;
      }
      case TUPLE:
        push(new_container(kind::tuple, pop_mark("TUPLE")));
        return;
      case LIST:
        push(new_container(kind::list, pop_mark("LIST")));
        return;
      case DICT: {
        auto items = pop_mark("DICT");
        if (items.size() % 2 != 0) fail("DICT with a key without a value");
        push(new_container(kind::dict, std::move(items)));
        return;
      }
      case APPEND: {
        const std::uint32_t value = pop("APPEND");
        target("APPEND", kind::list).push_back(value);
        return;
      }
      case APPENDS: {
        auto values = pop_mark("APPENDS");
        auto& list = target("APPENDS", kind::list);
        list.insert(list.end(), values.begin(), values.end());
        return;
      }
      case SETITEM: {
        const std::uint32_t value = pop("SETITEM");
        const std::uint32_t key = pop("SETITEM");
        auto& dict = target("SETITEM", kind::dict);
        dict.push_back(key);
        dict.push_back(value);
        return;
      }
      case SETITEMS: {
        auto pairs = pop_mark("SETITEMS");
        if (pairs.size() % 2 != 0) fail("SETITEMS with a key without a value");
        auto& dict = target("SETITEMS", kind::dict);
        dict.insert(dict.end(), pairs.begin(), pairs.end());
        return;
      }
      case BINPUT:
        memo_put(read_le(1), "BINPUT");
        return;
      case LONG_BINPUT:
        memo_put(read_le(4), "LONG_BINPUT");
        return;
      case MEMOIZE:
        memo_put(memo_.size(), "MEMOIZE");
        return;
      case BINGET:
        memo_get(read_le(1));
        return;
      case LONG_BINGET:
        memo_get(read_le(4));
        return;
      default:
        break;
    }
    if (const char* name = refused_name(code))
      fail(
          fmt::format("opcode {} (0x{:02x}) refused: only plain data (dict, "
                      "list, tuple, str, bytes, int, "
                      "float, bool, None; protocols 2 to 5) is read, nothing "
                      "is constructed or executed",
                      name, code));
    fail(fmt::format("unknown opcode 0x{:02x}", code));
  }

  // What converted values take on the heap, at most, so that the limit
  // bounds real memory (issue 27: a 1 KB pickle peaked at 231 MiB when each
  // value counted 16 bytes). nlohmann's json keeps a string, array or object
  // behind a pointer; malloc adds up to 16 bytes to a block; a std::string
  // holds up to short_capacity characters in place; an array doubles, and
  // while it grows holds its old and its new elements (3 slots per element);
  // an object entry is a tree node (colour and three links) holding the key
  // and the value.
  static constexpr std::size_t block_overhead = 16;
  static constexpr std::size_t string_bytes = sizeof(json::string_t) + block_overhead;
  static constexpr std::size_t array_bytes = sizeof(json::array_t) + block_overhead;
  static constexpr std::size_t element_bytes = 3 * sizeof(json);
  static constexpr std::size_t object_bytes = sizeof(json::object_t) + block_overhead;
  static constexpr std::size_t entry_bytes = sizeof(json::object_t::value_type) + 4 * sizeof(void*) + block_overhead;
  static std::size_t text_bytes(std::size_t length) {
    static const std::size_t short_capacity = std::string().capacity();
    return length <= short_capacity ? 0 : length + 1 + block_overhead;
  }

  void spend(std::size_t bytes) {
    spent_ += bytes;
    if (spent_ > limit_)
      fail_result(fmt::format("the data expands beyond {} bytes (values shared through the memo)", limit_));
  }

  std::string_view text_of(const node& n) const { return in_.substr(n.value, n.aux); }

  // A dict key as json.dump writes it.
  std::string key_of(std::uint32_t id) const {
    const node& n = nodes_[id];
    switch (n.k) {
      case kind::text:
        return std::string(text_of(n));
      case kind::non_negative:
        return std::to_string(n.value);
      case kind::negative:
        return std::to_string(static_cast<std::int64_t>(n.value));
      case kind::boolean:
        return n.value != 0 ? "true" : "false";
      case kind::none:
        return "null";
      default:
        break;
    }
    fail_result(fmt::format("a dict key is a {}; JSON keys are str, int, bool or None", kind_name(n.k)));
  }

  // `depth`: how many containers enclose node `id`.
  void convert(std::uint32_t id, std::size_t depth, json& out) {
    const node& n = nodes_[id];
    switch (n.k) {
      case kind::none:
        out = nullptr;
        return;
      case kind::boolean:
        out = n.value != 0;
        return;
      case kind::negative:
        out = static_cast<std::int64_t>(n.value);
        return;
      case kind::non_negative:
        out = n.value;
        return;
      case kind::real:
        out = std::bit_cast<double>(n.value);
        return;
      case kind::text:
        spend(string_bytes + text_bytes(n.aux)), out = std::string(text_of(n));
        return;
      default:
        break;
    }
    if (depth + 1 > options_->max_depth)
      fail_result(fmt::format("containers nest deeper than {} (or refer to themselves)", options_->max_depth));
    const std::vector<std::uint32_t>& items = items_[n.aux];
    if (n.k != kind::dict) {
      spend(array_bytes);
      out = json::array();
      for (const std::uint32_t child : items) {
        spend(element_bytes);
        convert(child, depth + 1, out.emplace_back());
      }
      return;
    }
    spend(object_bytes);
    out = json::object();
    for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
      std::string key = key_of(items[i]);
      if (options_->keep && !options_->keep(depth + 1, key)) continue;
      spend(entry_bytes + text_bytes(key.size()));
      json& slot = out[std::move(key)];
      slot = nullptr;
      convert(items[i + 1], depth + 1, slot);
    }
  }

  std::string_view in_;
  std::string_view file_;
  std::size_t pos_ = 0;
  std::size_t at_ = 0;  // offset of the opcode being run
  std::vector<node> nodes_;
  std::vector<std::vector<std::uint32_t>> items_;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;
  absl::flat_hash_map<std::uint64_t, std::uint32_t> memo_;
  const pickle_options* options_ = nullptr;
  std::size_t limit_ = 0;
  std::size_t spent_ = 0;
};

}  // namespace

bool looks_like_pickle(std::string_view content) noexcept {
  return !content.empty() && static_cast<std::uint8_t>(content.front()) == PROTO;
}

absl::StatusOr<nlohmann::json> read_pickle(std::string_view content, std::string_view file,
                                           const pickle_options& options) {
  try {
    machine m(content, file);
    const std::uint32_t root = m.run();
    return m.to_json(root, options);
  } catch (const pickle_error& e) {
    return absl::InvalidArgumentError(e.what);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(fmt::format("{}: pickle: out of memory while reading", file));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: pickle: {}", file, e.what()));
  }
}

}  // namespace fragctl::trace_detail
