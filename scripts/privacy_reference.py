#!/usr/bin/env python3
"""Reference epsilons for privacy/accountant.h, from opacus and dp-accounting (PyPI).

Creates a virtual environment outside the repository (default: $XDG_CACHE_HOME/xsilo/privacy-venv,
~/.cache when unset), installs opacus and dp-accounting into it, and runs itself there to write
tests/data/privacy_reference.json, which tests/privacy_test.cpp checks the C++ accountant against:

  subsampled_gaussian: q in {0.001, 0.01, 0.1, 1}, sigma in {0.5, 0.8, 1, 2, 5},
                       steps in {1, 100, 10000}, delta 1e-5: epsilon and best order from
                       opacus (RDP accountant, its DEFAULT_ALPHAS) and from dp-accounting
                       (RdpAccountant, its default orders, PoissonSampledDpEvent of a GaussianDpEvent)
  discrete_gaussian:   one discrete Gaussian: dp-accounting's DiscreteGaussianDpEvent, or where the
                       release lacks it, the ZCDpEvent of rho = l2^2 / (2 sigma^2) it stands for
  formula:             Skellam and distributed discrete Gaussian sums: dp-accounting has neither,
                       so this script evaluates the papers' RDP bounds itself (Agarwal, Kairouz,
                       Liu 2021; Kairouz, Liu, Steinke 2021, as in google-research/federated's
                       distributed_dp/accounting_utils.py) and converts with dp-accounting's
                       compute_epsilon: a second transcription of the formulas, not a second
                       implementation of the mathematics.

Usage:
  scripts/privacy_reference.py                 # venv + install + write the JSON
  scripts/privacy_reference.py --venv DIR      # another venv location
  python scripts/privacy_reference.py --here --small --out -
      # in an interpreter that already has both packages: a few cases, JSON on stdout
      # (what the live test in tests/privacy_test.cpp runs)
"""

import argparse
import json
import math
import os
import subprocess
import sys
import venv
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DELTA = 1e-5
QS = [0.001, 0.01, 0.1, 1.0]
SIGMAS = [0.5, 0.8, 1.0, 2.0, 5.0]
STEPS = [1, 100, 10000]
# (l2 sensitivity, sigma, steps) of one discrete Gaussian.
DISCRETE_GAUSSIAN = [(1.0, 1.0, 1), (1.0, 2.0, 100), (3.0, 10.0, 1000), (100.0, 400.0, 50)]
# Skellam sums: (l1, l2, variance, steps), integer units.
SKELLAM = [(10.0, 1.0, 4.0, 1), (1000.0, 100.0, 1.0e5, 100), (1.0e4, 300.0, 1.0e6, 1000)]
# Distributed discrete Gaussian sums: (l1, l2, sigma per silo, silos, dim, steps), integer units.
DDG = [(10.0, 1.0, 1.0, 1, 10, 1), (1000.0, 100.0, 60.0, 10, 1000, 100),
       (1.0e4, 300.0, 0.5, 100, 4096, 10), (1.0e4, 300.0, 0.3, 100, 4096, 10)]


def default_venv():
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "xsilo" / "privacy-venv"


def make_venv(where):
    py = where / "bin" / "python"
    if not py.exists():
        print(f"creating {where}", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(where)
    have = subprocess.run([py, "-c", "import opacus, dp_accounting"], capture_output=True).returncode == 0
    if not have:
        # opacus needs torch; the CPU wheel is a tenth of the CUDA one. Without the PyTorch index,
        # pip takes torch from PyPI with the rest.
        cpu = subprocess.run([py, "-m", "pip", "install", "-q", "torch", "--index-url",
                              "https://download.pytorch.org/whl/cpu"])
        if cpu.returncode != 0:
            print("the PyTorch CPU index was not reachable: torch comes from PyPI", file=sys.stderr)
        r = subprocess.run([py, "-m", "pip", "install", "-q", "opacus", "dp-accounting"])
        if r.returncode != 0:
            sys.exit("pip install opacus dp-accounting failed: no reference values written")
    return py


def finite(x):
    x = float(x)
    return x if math.isfinite(x) else None  # JSON has no infinity: null


def opacus_epsilon(q, sigma, steps):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp
    orders = RDPAccountant.DEFAULT_ALPHAS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "optimal order is the largest alpha": recorded, not shouted
        curve = rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
        eps, order = rdp.get_privacy_spent(orders=orders, rdp=curve, delta=DELTA)
    return {"epsilon": finite(eps), "order": finite(order)}


def dp_accounting_epsilon(events):
    from dp_accounting.rdp import rdp_privacy_accountant as rdp
    acc = rdp.RdpAccountant()
    for event, count in events:
        acc.compose(event, count)
    eps, order = acc.get_epsilon_and_optimal_order(DELTA)
    return {"epsilon": finite(eps), "order": finite(order)}


def skellam_rdp(l1, l2, mu, a):
    a = math.ceil(a)
    return a * l2 ** 2 / (2 * mu) + min(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2), 3 * l1 / (2 * mu))


def ddg_rdp(l1, l2, sigma, n, dim, a):
    a = a if n == 1 else math.ceil(a)
    tau = 10 * sum(math.exp(-2 * math.pi ** 2 * sigma ** 2 * k / (k + 1)) for k in range(1, n))
    l2s, l1s = l2 / (math.sqrt(n) * sigma), l1 / (math.sqrt(n) * sigma)
    return min(a / 2 * l2s ** 2 + tau * dim,
               a / 2 * (l2s ** 2 + 2 * l1s * tau + tau ** 2 * dim),
               a / 2 * (l2s + tau * math.sqrt(dim)) ** 2)


def formula_epsilon(rdp_of, steps):
    from dp_accounting.rdp import rdp_privacy_accountant as rdp
    orders = list(rdp.DEFAULT_RDP_ORDERS)
    eps, order = rdp.compute_epsilon(orders, [steps * rdp_of(a) for a in orders], DELTA)
    return {"epsilon": finite(eps), "order": finite(order)}


def compute(small):
    from dp_accounting import dp_event as ev
    from dp_accounting.rdp import rdp_privacy_accountant as rdp
    from importlib.metadata import version
    from opacus.accountants import RDPAccountant

    grid = [(q, s, t) for q in QS for s in SIGMAS for t in STEPS]
    if small:
        grid = [(0.01, 1.0, 100), (0.1, 2.0, 10000), (1.0, 5.0, 1)]
    out = {
        "generated_by": "scripts/privacy_reference.py",
        "versions": {p: version(p) for p in ("opacus", "dp-accounting", "numpy", "scipy")},
        "delta": DELTA,
        "orders": {"opacus": [float(a) for a in RDPAccountant.DEFAULT_ALPHAS],
                   "dp_accounting": [float(a) for a in rdp.DEFAULT_RDP_ORDERS]},
        "subsampled_gaussian": [],
        "discrete_gaussian": [],
        "formula": [],
    }
    for q, sigma, steps in grid:
        event = ev.PoissonSampledDpEvent(q, ev.GaussianDpEvent(sigma))
        out["subsampled_gaussian"].append({
            "q": q, "sigma": sigma, "steps": steps,
            "opacus": opacus_epsilon(q, sigma, steps),
            "dp_accounting": dp_accounting_epsilon([(event, steps)]),
        })
    if small:
        return out
    for l2, sigma, steps in DISCRETE_GAUSSIAN:
        if hasattr(ev, "DiscreteGaussianDpEvent"):
            event, name = ev.DiscreteGaussianDpEvent(sigma=sigma, sensitivity=l2), "DiscreteGaussianDpEvent"
        else:
            # Releases before it (0.6.0 on PyPI): the zCDP that event stands for (Canonne, Kamath,
            # Steinke 2020, Proposition 5), as a ZCDpEvent.
            event, name = ev.ZCDpEvent(rho=l2 ** 2 / (2 * sigma ** 2)), "ZCDpEvent"
        out["discrete_gaussian"].append({"l2": l2, "sigma": sigma, "steps": steps, "event": name,
                                         "dp_accounting": dp_accounting_epsilon([(event, steps)])})
    for l1, l2, mu, steps in SKELLAM:
        out["formula"].append({"mechanism": "skellam_sum", "l1": l1, "l2": l2, "variance": mu, "steps": steps,
                               "dp_accounting_conversion": formula_epsilon(lambda a: skellam_rdp(l1, l2, mu, a), steps)})
    for l1, l2, sigma, n, dim, steps in DDG:
        out["formula"].append({"mechanism": "discrete_gaussian_sum", "l1": l1, "l2": l2, "sigma": sigma,
                               "silos": n, "dim": dim, "steps": steps,
                               "dp_accounting_conversion": formula_epsilon(
                                   lambda a: ddg_rdp(l1, l2, sigma, n, dim, a), steps)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path, default=default_venv(), help="where the venv lives (never the repository)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "privacy_reference.json"), help="'-': stdout")
    ap.add_argument("--here", action="store_true", help="use this interpreter, which has both packages")
    ap.add_argument("--small", action="store_true", help="three Gaussian cases only")
    args = ap.parse_args()
    if not args.here:
        py = make_venv(args.venv.resolve())
        cmd = [str(py), __file__, "--here", "--out", args.out] + (["--small"] if args.small else [])
        sys.exit(subprocess.run(cmd).returncode)
    text = json.dumps(compute(args.small), indent=1) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
