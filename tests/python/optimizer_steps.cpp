// For the Python tests: runs lowbit::optim::AdamW (Q8 state, lr 1e-2, weight decay 1e-2) over the
// tensors in a file written by torch.save([p, g1, g2, ...]) and writes [p, state tensors...] after
// one step per gradient, so Python can compare its own op calls with the C++ optimizer.
//   lowbit_optimizer_steps IN OUT
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <iterator>

#include <lowbit/lowbit.h>
#include <lowbit/tools/program_args.h>

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv,
                               "usage: lowbit_optimizer_steps IN OUT\n"
                               "Runs the optimizer steps IN describes (tests/python) and writes the results to OUT.\n"))
    return 0;
  if (argc != 3) {
    std::cerr << "usage: lowbit_optimizer_steps IN OUT\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto inputs = torch::pickle_load(bytes).toList();
  std::vector<at::Tensor> params = {inputs.get(0).toTensor().clone()};
  lowbit::optim::AdamW opt(params,
                           lowbit::optim::AdamWOptions(1e-2).weight_decay(1e-2).state_format(lowbit::StateFormat::Q8));
  for (size_t i = 1; i < inputs.size(); ++i) {
    params[0].mutable_grad() = inputs.get(i).toTensor();
    opt.step();
  }
  c10::List<at::Tensor> out;
  out.push_back(params[0]);
  for (const auto& s : opt.state_of(params[0])->slots) {
    out.push_back(s.quantized.codes());
    out.push_back(s.quantized.absmax());
  }
  const std::vector<char> data = torch::pickle_save(c10::IValue(out));
  std::ofstream(argv[2], std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  return 0;
}
