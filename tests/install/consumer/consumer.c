/* Links against an installed lnmlp and checks that the library it loads is the one it was built for;
 * prints the build info after asking for the CUDA backend, which then names the CUDA module's file
 * (tests/install/check_install.cmake checks that it is the installed one). */
#include <stdio.h>

#define LNMLP_EXPERIMENTAL /* LNMLP_BACKEND_CUDA */
#include <lnmlp.h>

int main(void) {
  int32_t major = -1, abi = -1, cuda = -1;
  const char* info = NULL;
  lnmlp_desc* d = NULL;
  lnmlp_plan* p = NULL;
  if (lnmlp_get_version(&major, NULL, NULL, &abi) != LNMLP_SUCCESS || abi != LNMLP_ABI_VERSION) return 1;
  if (lnmlp_desc_create(&d) != LNMLP_SUCCESS || lnmlp_desc_set_shape(d, 4, 8, 16) != LNMLP_SUCCESS) return 2;
  if (lnmlp_plan_create(d, &p) != LNMLP_SUCCESS) {
    fprintf(stderr, "%s\n", lnmlp_last_error());
    return 3;
  }
  lnmlp_plan_destroy(p);
  lnmlp_desc_destroy(d);
  /* Never fails for a missing module, driver or GPU: it answers LNMLP_UNSUPPORTED. */
  if (lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &cuda) != LNMLP_SUCCESS) return 4;
  if (lnmlp_get_build_info(&info) != LNMLP_SUCCESS) return 5;
  printf("consumer: lnmlp %d, ABI %d; %s\n", major, abi, info);
  return 0;
}
