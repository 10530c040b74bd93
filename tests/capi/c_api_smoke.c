/* The C API from C (C99, -Wpedantic): the headers compile as C and
 * libfragctl.so exports what they declare. Runs on the sim backend. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "fragctl/checkpoint/checkpoint.h"
#include "fragctl/fragctl.h"
#include "fragctl/zero3/zero3.h"

#define CHECK(condition)                                                             \
  do {                                                                               \
    if (!(condition)) {                                                              \
      fprintf(stderr, "c_api_smoke: %s failed: %s\n", #condition, fragctl_last_error()); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int main(void) {
  fragctl_allocator* allocator = NULL;
  void* block = NULL;
  char* json = NULL;
  CHECK(fragctl_create("buckets:arena", "sim_capacity:1GiB", "sim", 0, &allocator) == FRAGCTL_OK);
  CHECK(fragctl_malloc(allocator, &block, 1000, NULL) == FRAGCTL_OK && block != NULL);
  CHECK(fragctl_stats_json(allocator, &json) == FRAGCTL_OK);
  CHECK(strstr(json, "\"allocator\": \"buckets:arena\"") != NULL);
  fragctl_string_free(json);
  {
    /* A caller built against an older, smaller fragctl_counters (its size
     * and `requested` only): told what was filled, nothing past it written.
     * Before, struct_size came back as the library's whole size. */
    fragctl_counters whole;
    unsigned char* bytes = (unsigned char*)&whole;
    const size_t small = offsetof(fragctl_counters, requested) + sizeof whole.requested;
    size_t i;
    memset(&whole, 0xAB, sizeof whole);
    whole.struct_size = small;
    CHECK(fragctl_get_counters(allocator, &whole) == FRAGCTL_OK);
    CHECK(whole.struct_size == small && whole.requested == 1000);
    for (i = small; i < sizeof whole; ++i) CHECK(bytes[i] == 0xAB);
  }
  /* Any int a C caller holds is a status to name: an unknown one is
   * "FRAGCTL_ERROR_UNKNOWN" (UBSan flagged the library's read of it). */
  CHECK(strcmp(fragctl_status_string((fragctl_status)16), "FRAGCTL_ERROR_UNKNOWN") == 0);
  CHECK(strcmp(fragctl_status_string(FRAGCTL_ERROR_IO), "FRAGCTL_ERROR_IO") == 0);
  CHECK(fragctl_free(allocator, block, 1000, NULL) == FRAGCTL_OK);
  CHECK(fragctl_free(allocator, block, 1000, NULL) == FRAGCTL_ERROR_NOT_OWNED);
  CHECK(strlen(fragctl_last_error()) > 0);
  CHECK(fragctl_destroy(allocator) == FRAGCTL_OK);
  CHECK(fragctl_create("nosuch", NULL, "sim", 0, &allocator) == FRAGCTL_ERROR_INVALID_ARGUMENT);
  CHECK(fragctl_zero3_default_options_json(&json) == FRAGCTL_OK);
  CHECK(strstr(json, "\"stage3_max_live_parameters\"") != NULL);
  fragctl_string_free(json);
  CHECK(fragctl_zero3_create(NULL, NULL, NULL, "local", NULL) == FRAGCTL_ERROR_INVALID_ARGUMENT);
  CHECK(fragctl_checkpoint_alignment() == 512);
  printf("c_api_smoke: ok (fragctl %s, policies %s)\n", fragctl_version(), fragctl_policy_names());
  return 0;
}
