// Names STYLE.md forbids, for CTest's public_header_names_catches_a_bad_name:
// the naming check (.clang-tidy) must reject each of them.
namespace fragctl {
class BadName {
 public:
  int Get();

 private:
  int member;
};
}  // namespace fragctl
