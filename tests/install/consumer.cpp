// Quantizes a tensor through the installed library and checks the round trip.
#include <lowbit/lowbit.h>

#include <iostream>

int main() {
  const at::Tensor x = at::randn({1000});
  const lowbit::QTensor q = lowbit::quantize(x, lowbit::QuantFormat::Dyn8Signed);
  const double err = (q.dequantize() - x).abs().max().item<double>() / x.abs().max().item<double>();
  std::cout << lowbit::version() << " max error " << err << " bytes " << q.nbytes() << "\n";
  return err < 0.01 && q.nbytes() == 1000 + 4 * 4 ? 0 : 1;
}
