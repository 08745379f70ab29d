#include "cli/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

// The file's contents, or "" when it cannot be read (yet).
std::string ReadSmallFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  return text.ok() ? *text : std::string();
}

}  // namespace

LocalCluster::LocalCluster(LocalClusterOptions options)
    : options_(std::move(options)) {}

LocalCluster::~LocalCluster() { Stop(); }

absl::StatusOr<pid_t> LocalCluster::Spawn(
    const std::string& name, const std::vector<std::string>& argv) {
  const std::string log =
      absl::StrCat(options_.data_dir, "/logs/", name, ".log");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(name, ": cannot execute ", argv[0],
                                            ": ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    // Our own process group: Ctrl-C reaches `trainyard up`, which stops the
    // children in order, instead of killing everything at once. And if
    // `trainyard up` itself dies (even by SIGKILL), the kernel sends us
    // SIGTERM, so no daemon is left behind.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent died before prctl
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  children_.push_back({name, log, pid});
  return pid;
}

absl::StatusOr<int> LocalCluster::WaitForPort(const std::string& port_file) {
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  while (true) {
    std::string text(absl::StripAsciiWhitespace(ReadSmallFile(port_file)));
    int port = 0;
    if (!text.empty() && absl::SimpleAtoi(text, &port) && port > 0) {
      return port;
    }
    if (auto st = CheckChildren(); !st.ok()) return st;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("controller did not report its port within ",
                       absl::FormatDuration(options_.start_timeout), "; see ",
                       children_[0].log));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status LocalCluster::Start() {
  RETURN_IF_ERROR(CreateDirectories(options_.data_dir + "/logs"));
  RETURN_IF_ERROR(CreateDirectories(options_.data_dir + "/controller"));
  // Secure by default: a throw-away CA, certificates and an admin token,
  // new for every start.
  std::vector<std::string> controller_security = {"--insecure"};
  std::vector<std::string> worker_security = {"--insecure"};
  if (!options_.insecure) {
    ASSIGN_OR_RETURN(credentials_,
                     WriteClusterCredentials(options_.data_dir + "/pki", {},
                                             /*overwrite=*/true));
    controller_security = {"--tls_cert=" + credentials_.controller_cert,
                           "--tls_key=" + credentials_.controller_key,
                           "--tls_ca=" + credentials_.ca_cert,
                           "--tokens_file=" + credentials_.tokens};
    worker_security = {"--tls_cert=" + credentials_.worker_cert,
                       "--tls_key=" + credentials_.worker_key,
                       "--tls_ca=" + credentials_.ca_cert};
  }
  const std::string port_file = options_.data_dir + "/controller.port";
  unlink(port_file.c_str());
  std::vector<std::string> controller_argv = {
      options_.controller_bin, "--listen=127.0.0.1:0",
      "--data_dir=" + options_.data_dir + "/controller",
      "--port_file=" + port_file};
  if (!options_.job_data_dir.empty()) {
    controller_argv.push_back("--job_data_dir=" + options_.job_data_dir);
  }
  controller_argv.insert(controller_argv.end(), controller_security.begin(),
                         controller_security.end());
  auto pid = Spawn("controller", controller_argv);
  if (!pid.ok()) return pid.status();
  ASSIGN_OR_RETURN(const int port, WaitForPort(port_file));
  address_ = absl::StrCat("127.0.0.1:", port);
  for (int i = 0; i < options_.workers; ++i) {
    std::vector<std::string> argv = {
        options_.worker_bin,
        "--controller=" + address_,
        "--listen=127.0.0.1:0",
        absl::StrCat("--name=worker-", i),
        absl::StrCat("--threads=", options_.threads_per_worker),
        "--device=" + options_.device};
    if (!options_.plugin_dir.empty()) {
      argv.push_back("--plugin_dir=" + options_.plugin_dir);
    }
    if (!options_.job_data_dir.empty()) {
      argv.push_back("--data_dir=" + options_.job_data_dir);
    }
    argv.insert(argv.end(), worker_security.begin(), worker_security.end());
    auto wpid = Spawn(absl::StrCat("worker-", i), argv);
    if (!wpid.ok()) return wpid.status();
  }
  return absl::OkStatus();
}

namespace {

// The last non-empty line of a child's log (at most 300 bytes of it), so a
// crash at start-up says why without opening the file.
std::string LastLogLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  in.seekg(from);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.read(&tail[0], static_cast<std::streamsize>(tail.size()));
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) {
    tail.pop_back();
  }
  const size_t nl = tail.rfind('\n');
  std::string line = nl == std::string::npos ? tail : tail.substr(nl + 1);
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line;
}

}  // namespace

absl::Status LocalCluster::CheckChildren() {
  for (Child& c : children_) {
    if (c.pid <= 0) continue;
    int status = 0;
    pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) {
      c.pid = -1;
      const std::string last = LastLogLine(c.log);
      return absl::UnavailableError(absl::StrCat(
          c.name, " exited (",
          WIFEXITED(status) ? absl::StrCat("status ", WEXITSTATUS(status))
                            : absl::StrCat("signal ", WTERMSIG(status)),
          ")", last.empty() ? "" : absl::StrCat(": ", last), "; see ", c.log));
    }
  }
  return absl::OkStatus();
}

void LocalCluster::Stop() {
  // Workers first, then the controller, so no worker reports into a void.
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<Child*> group;
    for (Child& c : children_) {
      const bool is_controller = c.name == "controller";
      if (c.pid > 0 && is_controller == (pass == 1)) group.push_back(&c);
    }
    for (Child* c : group) kill(c->pid, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    for (Child* c : group) {
      while (c->pid > 0) {
        int status = 0;
        if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
          c->pid = -1;
        } else if (absl::Now() > deadline) {
          kill(c->pid, SIGKILL);
          waitpid(c->pid, &status, 0);
          c->pid = -1;
        } else {
          absl::SleepFor(absl::Milliseconds(20));
        }
      }
    }
  }
}

}  // namespace trainyard
