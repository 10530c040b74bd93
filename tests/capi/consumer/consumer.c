/* Linking fragctl from C: an allocator by policy name, a block, statistics. */
#include <stdio.h>
#include <string.h>

#include "fragctl/fragctl.h"

int main(void) {
  fragctl_allocator* allocator = NULL;
  if (fragctl_create("arena", "sim_capacity:1GiB", "sim", /*device=*/0, &allocator) != FRAGCTL_OK) {
    fprintf(stderr, "fragctl: %s\n", fragctl_last_error());
    return 1;
  }
  void* block = NULL;
  fragctl_status status = fragctl_malloc(allocator, &block, 64 << 20, /*stream=*/NULL);
  if (status == FRAGCTL_OK) status = fragctl_free(allocator, block, 64 << 20, NULL);
  char* json = NULL;
  if (status == FRAGCTL_OK) status = fragctl_stats_json(allocator, &json);
  if (status == FRAGCTL_OK) printf("%s\n", strstr(json, "\"requested_bytes\""));
  fragctl_string_free(json);
  fragctl_destroy(allocator);
  return status == FRAGCTL_OK ? 0 : 1;
}
