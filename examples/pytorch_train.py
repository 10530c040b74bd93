"""fragctl under PyTorch: every CUDA tensor of a small training loop comes
from fragctl's arena policy; one summary line at the end and a report file.

    PYTHONPATH=python python examples/pytorch_train.py [report.json]

Needs torch 2.x and a CUDA GPU; without them it says so and exits 77 (the
test suite counts that as a skip).
"""
import sys

SKIP = 77


def main(report_path):
    try:
        import torch
    except ImportError:
        print("example skipped: torch is not installed")
        return SKIP
    if int(torch.__version__.split(".")[0]) < 2 or not torch.cuda.is_available():
        print("example skipped: needs torch 2.x with a CUDA GPU (have torch %s, cuda available: %s)"
              % (torch.__version__, torch.cuda.is_available()))
        return SKIP

    import fragctl
    import fragctl.torch

    fragctl.torch.enable("arena", report=report_path)  # before anything touches CUDA
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    with fragctl.summary("train", file=sys.stdout) as block:
        for step in range(20):
            batch = torch.randn(64 + 16 * (step % 4), 1024, device="cuda")  # varying shapes fragment caches
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    fragctl.report(report_path)
    print("report written to %s" % report_path)
    return 0 if block.result is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "pytorch_train.report.json"))
