// A thread that runs the tasks given to it one at a time, in the order given: ShardedOptimizer's
// overlap hooks hand it their work (each gradient's copy into its bucket, the buckets' collectives)
// so that backward()'s own thread goes on launching kernels. Internal: not an installed header.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace lowbit {
namespace distributed {

class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();  // runs what is queued (its errors dropped), then ends the thread
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `task`. Once a task has thrown, the tasks after it are dropped unrun, and post() and
  // drain() rethrow its error (drain() once: the worker is then usable again).
  void post(std::function<void()> task);
  // Returns once every task posted so far has run (or was dropped after an error).
  void drain();

 private:
  void run();
  void rethrow_locked();  // mu_ held

  std::mutex mu_;
  std::condition_variable wake_;  // to the thread: a task, or stop
  std::condition_variable idle_;  // to drain(): the queue ran empty
  std::deque<std::function<void()>> tasks_;
  bool running_ = false;  // the thread is inside a task
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace distributed
}  // namespace lowbit
