// Quantizes a tensor through the installed library and checks the round trip.
#include <lowbit/lowbit.h>

#include <iostream>

int main() {
  const at::Tensor x = at::randn({1000});
  const lowbit::QTensor q = lowbit::quantize(x, lowbit::QuantFormat::Dyn8Signed);
  const double err = (q.dequantize() - x).abs().max().item<double>() / x.abs().max().item<double>();
  std::cout << lowbit::version() << " max error " << err << " bytes " << q.nbytes() << "\n";
  // An optimizer from the installed headers alone (they carry no kernel internals).
  std::vector<at::Tensor> params = {at::randn({5000})};
  lowbit::optim::AdamW opt(params, lowbit::optim::AdamWOptions(1e-2).state_format(lowbit::StateFormat::Q8));
  params[0].mutable_grad() = at::randn({5000});
  opt.step();
  const bool stepped = opt.state_of(params[0])->step() == 1 && opt.state_bytes() == 2 * (5000 + 20 * 4);
  return err < 0.01 && q.nbytes() == 1000 + 4 * 4 && stepped ? 0 : 1;
}
