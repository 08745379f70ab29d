// CliFlags: the values of the `trainyard` command line's flags, read once in
// main after parsing (cli/trainyard_main.cc defines the flags and their help
// text, defaults included) and handed to the commands. Each field holds the
// flag of the same name; the flag's help text says which commands read it.
#ifndef TRAINYARD_CLI_CLI_FLAGS_H_
#define TRAINYARD_CLI_CLI_FLAGS_H_

#include <cstdint>
#include <string>

namespace trainyard {

struct CliFlags {
  // train
  std::string spec;
  std::string checkpoint_dir;  // train: checkpoint.dir; infer/eval: the model's
  std::string output_dir;      // infer: inference.output_dir
  std::string metrics_out;
  int threads = 0;
  std::string precision;
  int64_t stop_after_step = 0;
  int timeout_s = 0;
  // train and up
  std::string plugin_dir;
  std::string device;
  // train and schedule
  int stages = 0;
  // schedule
  int microbatches = 0;
  std::string schedule;
  int chunks = 0;
  std::string costs;
  std::string svg;
  std::string costs_from;
  int width = 0;
  // How every client command reaches the controller (cli/connect.h).
  std::string controller;
  std::string tls_ca;
  std::string tls_server_name;
  std::string token_file;
  bool insecure = false;
  // submit
  int priority = 0;
  std::string request_id;
  bool watch = false;
  // watch (also submit --watch, logs and up --run)
  int64_t from_step = 0;
  int reconnect_s = 0;
  // list
  std::string state;
  int page_size = 0;
  std::string page_token;
  // cancel
  std::string reason;
  // get: the bare `--stages` switch of `get JOB --stages`, taken out of argv
  // before the flags are parsed (--stages is also train's stage count).
  bool get_stages = false;
  // up
  int workers = 0;
  std::string data_dir;
  std::string run;
  std::string job_data_dir;  // up: the folder jobs' files stay inside
  std::string controller_bin;
  std::string worker_bin;
  // certs and trace
  std::string out;
  // trace
  int64_t step = 0;
  // logs
  bool follow = false;
  // certs
  std::string hosts;
  // token
  std::string user;
  std::string role;
  std::string tokens_file;
  // health
  std::string address;
  std::string service;
};

}  // namespace trainyard

#endif  // TRAINYARD_CLI_CLI_FLAGS_H_
