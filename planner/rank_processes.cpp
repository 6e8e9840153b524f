#include "planner/rank_processes.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>

namespace tide::planner {
namespace {

constexpr std::size_t kMaxResult = 4096;

struct Pipe {
  int read = -1, write = -1;
  Pipe() {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("run_ranks: pipe failed");
    read = fds[0];
    write = fds[1];
  }
};

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

ssize_t read_byte(int fd) {
  char byte = 0;
  ssize_t n = 0;
  do n = ::read(fd, &byte, 1);
  while (n < 0 && errno == EINTR);
  return n;
}

std::string read_result(int fd) {
  std::string text;
  char buffer[512];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (text.size() < kMaxResult) text.append(buffer, static_cast<std::size_t>(n));
  }
  if (text.size() > kMaxResult) text.resize(kMaxResult);
  return text;
}

}  // namespace

std::vector<std::string> run_ranks(
    int ranks, bool local_env,
    const std::function<std::string(int rank, const RankBarrier& barrier)>& body) {
  struct Child {
    pid_t pid = -1;
    int ready = -1, go = -1, result = -1;
  };
  std::vector<Child> children;
  std::fflush(nullptr);
  for (int rank = 0; rank < ranks; ++rank) {
    Pipe ready, go, result;
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (const Child& c : children) {  // the other ranks' ends are not this rank's
        ::close(c.ready);
        ::close(c.go);
        ::close(c.result);
      }
      ::close(ready.read);
      ::close(go.write);
      ::close(result.read);
      int status = 0;
      try {
        ::unsetenv("LOCAL_SIZE");  // DeepSpeed's name for LOCAL_WORLD_SIZE (config/node.h)
        if (local_env) {
          ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
          ::setenv("LOCAL_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
        } else {
          ::unsetenv("LOCAL_RANK");
          ::unsetenv("LOCAL_WORLD_SIZE");
        }
        const RankBarrier barrier = [&] {
          write_all(ready.write, "r");
          read_byte(go.read);  // a byte: go; EOF: the parent is gone, go too
        };
        write_all(result.write, "ok " + body(rank, barrier));
      } catch (const std::exception& e) {
        write_all(result.write, std::string("error ") + e.what());
        status = 1;
      }
      std::fflush(nullptr);
      ::_exit(status);  // no static destructors: they are the parent's
    }
    ::close(ready.write);
    ::close(go.read);
    ::close(result.write);
    if (pid < 0) {
      ::close(ready.read);
      ::close(go.write);
      ::close(result.read);
      break;
    }
    children.push_back({pid, ready.read, go.write, result.read});
  }

  // The barrier: release every living rank once all of them wait.
  std::vector<bool> alive(children.size(), true), waiting(children.size(), false);
  std::size_t living = children.size(), waiting_count = 0;
  while (living > 0) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> index;
    for (std::size_t i = 0; i < children.size(); ++i) {
      if (alive[i] && !waiting[i]) {
        fds.push_back({children[i].ready, POLLIN, 0});
        index.push_back(i);
      }
    }
    if (!fds.empty() && ::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const std::size_t i = index[k];
      if (read_byte(children[i].ready) == 1) {
        waiting[i] = true;
        ++waiting_count;
      } else {
        alive[i] = false;
        --living;
      }
    }
    if (living > 0 && waiting_count == living) {
      for (std::size_t i = 0; i < children.size(); ++i) {
        if (alive[i] && waiting[i]) {
          write_all(children[i].go, "g");
          waiting[i] = false;
        }
      }
      waiting_count = 0;
    }
  }

  std::vector<std::string> out;
  std::string failure;
  for (std::size_t i = 0; i < children.size(); ++i) {
    std::string text = read_result(children[i].result);
    ::close(children[i].ready);
    ::close(children[i].go);
    ::close(children[i].result);
    int status = 0;
    while (::waitpid(children[i].pid, &status, 0) < 0 && errno == EINTR) {
    }
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && text.starts_with("ok ");
    if (!ok && failure.empty()) {
      failure = "rank " + std::to_string(i) + ": " +
                (text.starts_with("error ") ? text.substr(6)
                                            : "died (status " + std::to_string(status) + ")");
    }
    out.push_back(ok ? text.substr(3) : std::string());
  }
  if (failure.empty() && static_cast<int>(children.size()) != ranks) failure = "fork failed";
  if (!failure.empty()) throw std::runtime_error(failure);
  return out;
}

}  // namespace tide::planner
