// SerialWorker (serial_worker.h).
#include "serial_worker.h"

#include <utility>

namespace lowbit {
namespace distributed {

SerialWorker::SerialWorker() : thread_([this] { run(); }) {}

SerialWorker::~SerialWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void SerialWorker::rethrow_locked() {
  if (!error_) return;
  std::exception_ptr e = std::move(error_);
  error_ = nullptr;
  std::rethrow_exception(e);
}

void SerialWorker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);  // kept for drain(), which clears it
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void SerialWorker::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return tasks_.empty() && !running_; });
  rethrow_locked();
}

void SerialWorker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_, nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    running_ = true;
    lock.unlock();
    std::exception_ptr failed;
    try {
      task();
    } catch (...) {
      failed = std::current_exception();
    }
    task = nullptr;  // what it held (a gradient) goes now, not at the next task
    lock.lock();
    running_ = false;
    if (failed) {
      if (!error_) error_ = failed;
      tasks_.clear();
    }
    if (tasks_.empty()) idle_.notify_all();
  }
}

}  // namespace distributed
}  // namespace lowbit
