/* preload_probe_linked fragctl|native REPORT: the probe with the runtime linked. */
#include <string.h>

int probe_run(int fragctl, const char* report);

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  return probe_run(strcmp(argv[1], "fragctl") == 0, argv[2]);
}
