// A shared library that is not a task plugin: no trainyard_task_v1. Its
// constructor marks the process if it is ever loaded; the loader must refuse
// it before that.
#include <cstdlib>

extern "C" int not_a_task_plugin(void) { return 42; }

__attribute__((constructor)) static void MarkLoaded() {
  setenv("TRAINYARD_NO_SYMBOL_LOADED", "1", 1);
}
