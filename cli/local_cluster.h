// LocalCluster: `trainyard up` — a controller and N workers as child
// processes on 127.0.0.1 with free ports, under one data directory. Secure
// by default: Start makes a throw-away CA, certificates and an admin token
// in <data_dir>/pki, and the daemons run with TLS, worker certificates and
// tokens.
//
// Ownership: the LocalCluster owns its children; Stop() (also run by the
// destructor) sends SIGTERM, waits, and SIGKILLs what is left.
// Not thread-safe.
#ifndef TRAINYARD_CLI_LOCAL_CLUSTER_H_
#define TRAINYARD_CLI_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "security/cluster_credentials.h"

namespace trainyard {

struct LocalClusterOptions {
  std::string controller_bin;  // trainyard-controller
  std::string worker_bin;      // trainyard-worker
  std::string plugin_dir;      // for the workers; empty = their default
  std::string data_dir;        // controller state and logs go here
  // Every job's files stay inside this folder (absolute, symlinks
  // resolved): the workers' --data_dir and the controller's --job_data_dir.
  std::string job_data_dir;
  int workers = 3;
  std::string device = "cpu";  // every worker's --device ("cpu", "cuda:N")
  int threads_per_worker = 1;
  absl::Duration start_timeout = absl::Seconds(30);
  // Plaintext, no tokens (--insecure on every daemon).
  bool insecure = false;
};

class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Starts the controller, waits for its port, then starts the workers.
  // Logs go to <data_dir>/logs/*.log. Errors name the binary and the log.
  absl::Status Start();
  // "127.0.0.1:PORT" once started.
  const std::string& controller_address() const { return address_; }
  // The files Start wrote (empty when insecure).
  const ClusterCredentials& credentials() const { return credentials_; }
  // Non-OK if a child has exited (naming it and its log).
  absl::Status CheckChildren();
  void Stop();

 private:
  absl::StatusOr<pid_t> Spawn(const std::string& name,
                              const std::vector<std::string>& argv);
  // The port the controller (children_[0]) writes to `port_file`, once it
  // has; DeadlineExceeded after options_.start_timeout, or CheckChildren's
  // error when a child exits first.
  absl::StatusOr<int> WaitForPort(const std::string& port_file);

  LocalClusterOptions options_;
  std::string address_;
  ClusterCredentials credentials_;
  struct Child {
    std::string name;
    std::string log;
    pid_t pid;
  };
  std::vector<Child> children_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CLI_LOCAL_CLUSTER_H_
