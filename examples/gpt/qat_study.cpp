#include "qat_study.h"

#include <cstdio>
#include <fstream>

#include "optimizer.h"
#include "train.h"

namespace gpt {

double QatStudy::recovered() const { return ptq > fp32 ? (ptq - qat) / (ptq - fp32) : 0.0; }
double QatStudy::recovered_vs_tuned() const { return ptq_tuned > fp32_tuned ? (ptq_tuned - qat) / (ptq_tuned - fp32_tuned) : 0.0; }

namespace {

// --qat-steps steps at a constant lr on the training batches after the main run's, with or without
// fake quantization; a fresh optimizer of the run's kind. Returns the validation loss after them.
double fine_tune(const Flags& f, const Corpus& c, GPT& model, bool fake_quant, at::Device dev) {
  model->set_fake_quant(fake_quant ? f.qat_group : 0, f.qat_bits);
  const std::vector<at::Tensor> params = model->parameters();
  std::unique_ptr<TrainOptimizer> opt = make_optimizer(f, params);
  opt->set_lr(f.qat_lr > 0 ? f.qat_lr : f.lr * f.min_lr_ratio);
  for (int64_t s = 1; s <= f.qat_steps; ++s) {
    const auto xy = train_batch(c, f.batch, f.context, f.seed, f.steps + s, dev);
    opt->zero_grad();
    model->loss(xy.first, xy.second).backward();
    opt->step();
  }
  opt->zero_grad();
  return evaluate(model, f, c, dev);
}

}  // namespace

QatStudy run_qat_study(const Flags& f, const Corpus& c, GPT& model, double fp32_val, at::Device dev) {
  QatStudy q;
  q.fp32 = fp32_val;
  std::vector<at::Tensor> trained;
  {
    torch::NoGradGuard ng;
    for (const at::Tensor& p : model->parameters()) trained.push_back(p.detach().clone());
  }
  auto restore = [&] {
    torch::NoGradGuard ng;
    const std::vector<at::Tensor> params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(trained[i]);
    model->set_fake_quant(0);
  };
  model->set_fake_quant(f.qat_group, f.qat_bits);
  q.ptq = evaluate(model, f, c, dev);
  q.qat = fine_tune(f, c, model, true, dev);
  restore();
  q.fp32_tuned = fine_tune(f, c, model, false, dev);
  model->set_fake_quant(f.qat_group, f.qat_bits);
  q.ptq_tuned = evaluate(model, f, c, dev);
  restore();
  // The fair baseline is the fp32 model fine-tuned as long: QAT's steps also train the model further.
  std::printf("qat study: fp32 %.4f, PTQ %.4f; after %lld more steps: fp32 %.4f, its PTQ %.4f, QAT %.4f; "
              "QAT recovers %.0f %% of what PTQ loses\n",
              q.fp32, q.ptq, (long long)f.qat_steps, q.fp32_tuned, q.ptq_tuned, q.qat, 100 * q.recovered_vs_tuned());
  std::ofstream csv(f.out + "_qat.csv");
  csv << "fp32,ptq,qat,fp32_finetuned,ptq_finetuned,qat_steps,recovered,recovered_vs_finetuned\n"
      << q.fp32 << "," << q.ptq << "," << q.qat << "," << q.fp32_tuned << "," << q.ptq_tuned << "," << f.qat_steps
      << "," << q.recovered() << "," << q.recovered_vs_tuned() << "\n";
  return q;
}

}  // namespace gpt
