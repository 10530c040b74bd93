/* fragctl from C: an allocator from a policy string, blocks on two streams,
 * statistics as JSON and a report file (argv[1], default
 * example_c_api.report.json). Runs on the host simulator. */
#include <stdio.h>
#include <string.h>

#include "fragctl/fragctl.h"

#define CHECK(call)                                                         \
  do {                                                                      \
    if ((call) != FRAGCTL_OK) {                                             \
      fprintf(stderr, "%s failed: %s\n", #call, fragctl_last_error());      \
      return 1;                                                             \
    }                                                                       \
  } while (0)

int main(int argc, char** argv) {
  const char* report = argc > 1 ? argv[1] : "example_c_api.report.json";
  fragctl_allocator* allocator = NULL;
  CHECK(fragctl_create("buckets:arena", "sim_capacity:4GiB", "sim", /*device=*/0, &allocator));
  printf("fragctl %s, policy %s\n", fragctl_version(), fragctl_policy(allocator));

  /* Streams are the runtime's handles (cudaStream_t); on sim any distinct
   * non-null values. A block freed on one stream is reused on another only
   * after the free has completed there (docs/stream-order.md). */
  void* streams[2] = {(void*)0x1, (void*)0x2};
  void* blocks[8];
  for (int i = 0; i < 8; ++i) CHECK(fragctl_malloc(allocator, &blocks[i], (size_t)(i + 1) << 20, streams[i % 2]));
  for (int i = 0; i < 8; ++i) CHECK(fragctl_free(allocator, blocks[i], (size_t)(i + 1) << 20, streams[i % 2]));

  char* json = NULL;
  CHECK(fragctl_stats_json(allocator, &json));
  const char* requested = strstr(json, "\"requested_bytes\"");
  printf("%.60s...\n", requested != NULL ? requested : json);
  fragctl_string_free(json);
  CHECK(fragctl_write_report(allocator, report));
  printf("report written to %s (fragctl report %s)\n", report, report);
  CHECK(fragctl_destroy(allocator));
  return 0;
}
