// Internal to the pickle reader: the opcodes of pickle protocols 0 to 5, with
// the values and arguments of CPython's Lib/pickletools.py, and the ones the
// reader refuses.
#pragma once

#include <cstdint>

namespace fragctl::trace_detail::pickle_opcode {

// clang-format off
enum op : std::uint8_t {
  // Protocols 0 and 1.
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2', FLOAT = 'F', INT = 'I', BININT = 'J',
  BININT1 = 'K', LONG = 'L', BININT2 = 'M', NONE = 'N', PERSID = 'P', BINPERSID = 'Q', REDUCE = 'R',
  STRING = 'S', BINSTRING = 'T', SHORT_BINSTRING = 'U', UNICODE = 'V', BINUNICODE = 'X', APPEND = 'a',
  BUILD = 'b', GLOBAL = 'c', DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', GET = 'g', BINGET = 'h', INST = 'i',
  LONG_BINGET = 'j', LIST = 'l', EMPTY_LIST = ']', OBJ = 'o', PUT = 'p', BINPUT = 'q', LONG_BINPUT = 'r',
  SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G',
  // Protocol 2.
  PROTO = 0x80, NEWOBJ = 0x81, EXT1 = 0x82, EXT2 = 0x83, EXT4 = 0x84, TUPLE1 = 0x85, TUPLE2 = 0x86,
  TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b,
  // Protocol 3.
  BINBYTES = 'B', SHORT_BINBYTES = 'C',
  // Protocol 4.
  SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, EMPTY_SET = 0x8f, ADDITEMS = 0x90,
  FROZENSET = 0x91, NEWOBJ_EX = 0x92, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
  // Protocol 5.
  BYTEARRAY8 = 0x96, NEXT_BUFFER = 0x97, READONLY_BUFFER = 0x98,
};

struct named {
  std::uint8_t code;
  const char* name;
};

// Not read: the opcodes that construct or look up objects, sets (JSON has
// none) and the text opcodes of protocols 0 and 1.
inline constexpr named refused[] = {
    {GLOBAL, "GLOBAL"}, {STACK_GLOBAL, "STACK_GLOBAL"}, {REDUCE, "REDUCE"}, {BUILD, "BUILD"},
    {NEWOBJ, "NEWOBJ"}, {NEWOBJ_EX, "NEWOBJ_EX"}, {INST, "INST"}, {OBJ, "OBJ"}, {PERSID, "PERSID"},
    {BINPERSID, "BINPERSID"}, {EXT1, "EXT1"}, {EXT2, "EXT2"}, {EXT4, "EXT4"}, {NEXT_BUFFER, "NEXT_BUFFER"},
    {READONLY_BUFFER, "READONLY_BUFFER"}, {EMPTY_SET, "EMPTY_SET"}, {ADDITEMS, "ADDITEMS"},
    {FROZENSET, "FROZENSET"}, {INT, "INT"}, {LONG, "LONG"}, {FLOAT, "FLOAT"}, {STRING, "STRING"},
    {UNICODE, "UNICODE"}, {GET, "GET"}, {PUT, "PUT"},
};
// clang-format on

/// The name of a refused opcode, or nullptr for any other byte.
[[nodiscard]] constexpr const char* refused_name(std::uint8_t code) noexcept {
  for (const named& o : refused)
    if (o.code == code) return o.name;
  return nullptr;
}

}  // namespace fragctl::trace_detail::pickle_opcode
