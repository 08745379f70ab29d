// A shared library that is not a task plugin: no trainyard_task_v1.
extern "C" int not_a_task_plugin(void) { return 42; }
