/* preload_probe_dlopen PLUGIN fragctl|native REPORT: the probe loaded with
 * dlopen(RTLD_LOCAL), so its runtime is outside the global scope. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  void* plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (plugin == NULL) {
    fprintf(stderr, "probe: %s\n", dlerror());
    return 2;
  }
  typedef int (*run_fn)(int, const char*);
  run_fn run = (run_fn)dlsym(plugin, "probe_run");
  if (run == NULL) return 2;
  return run(strcmp(argv[2], "fragctl") == 0, argv[3]);
}
