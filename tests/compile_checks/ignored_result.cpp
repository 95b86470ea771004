// Compiled, never run, by the Result.IgnoredFailureDoesNotCompile tests (tests/CMakeLists.txt):
// as it is, every result is used and it compiles; with -DXSILO_DISCARD=n, failure n is dropped
// silently and the compiler must refuse it (-Werror): an ignored failure cannot ship.
#include "common/result.h"
#include "proto/status.h"

namespace {

xsilo::Status settle() { return xsilo::Error("not settled"); }
xsilo::Result<int> count() { return 3; }
xsilo::proto::Status refuse() { return xsilo::proto::error(xsilo::wire::BAD_UPDATE, "refused"); }
xsilo::proto::Result<int> parse() { return xsilo::proto::error(xsilo::wire::BAD_FRAME, "cut"); }

}  // namespace

int main() {
#if XSILO_DISCARD == 1
  settle();
#elif XSILO_DISCARD == 2
  count();
#elif XSILO_DISCARD == 3
  refuse();
#elif XSILO_DISCARD == 4
  parse();
#endif
  int failed = 0;
  failed += settle() ? 0 : 1;
  failed += count() ? 0 : 1;
  failed += refuse() ? 0 : 1;
  failed += parse() ? 0 : 1;
  return failed;
}
