"""Record-level differential privacy: what a silo's DP-SGD ran this round, for the agent.

The agent of a silo with a privacy budget (its config's ``privacy.max_epsilon``) accounts the
epsilon itself, from the parameters the script reports with each train result; it keeps the
update when the round would pass the budget, or when the script reports no DP-SGD at all
(docs/privacy.md). A script reports one of:

- Opacus's ``PrivacyEngine`` (or its accountant): the steps its accountant took since the last
  report, with their sample rate and noise multiplier;
- a dict ``{"sample_rate": q, "noise_multiplier": sigma, "steps": n, "clip_norm": c}``.
"""

import math


def _number(value, what):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"privacy: {what} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"privacy: {what} must be finite, got {value!r}")
    return v


def check(report):
    """The report as the protocol sends it; ValueError naming what is wrong."""
    if not isinstance(report, dict):
        raise ValueError("privacy must be a PrivacyEngine or a dict of sample_rate, noise_multiplier, steps")
    q = _number(report.get("sample_rate"), "sample_rate")
    sigma = _number(report.get("noise_multiplier"), "noise_multiplier")
    steps = report.get("steps")
    if not (0 < q <= 1):
        raise ValueError(f"privacy: sample_rate must be in (0, 1], got {q}")
    if sigma <= 0:
        raise ValueError(f"privacy: noise_multiplier must be > 0, got {sigma}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        try:
            import numpy as np
            ok = isinstance(steps, np.integer) and steps >= 1
        except ImportError:
            ok = False
        if not ok:
            raise ValueError(f"privacy: steps must be a positive integer, got {steps!r}")
    out = {"sample_rate": q, "noise_multiplier": sigma, "steps": int(steps)}
    if report.get("clip_norm") is not None:
        out["clip_norm"] = _number(report["clip_norm"], "clip_norm")
    return out


def batch_norm_layers(state_dict, federated=None):
    """The layers of a state dict that keep running batch statistics (BatchNorm: the prefixes of
    its ``running_mean`` entries), of those ``federated(name)`` sends (all without it); a model
    that is one BatchNorm layer is named "(the model)"."""
    names = []
    for key in state_dict:
        if not isinstance(key, str) or not (key == "running_mean" or key.endswith(".running_mean")):
            continue
        if federated is not None and not federated(key):
            continue
        names.append(key[: -len("running_mean")].rstrip(".") or "(the model)")
    return names


BATCH_NORM_UNDER_DP = (
    "the model has BatchNorm layers (%s) and the script reports DP-SGD: their running statistics are "
    "computed from the records without noise and federated with the weights, so the privacy guarantee "
    "does not cover them (and a batch's statistics mix its records); replace them with GroupNorm "
    "(opacus.validators.ModuleValidator.fix(model)) or keep them out of the federated state")


class Reporter:
    """Turns what a script passes as ``privacy`` into one round's report. For an Opacus engine it
    remembers how many of the accountant's steps were already reported."""

    def __init__(self):
        self._accountant = None  # the accountant whose steps were last reported
        self._reported = 0       # how many of its steps
        self._pending = None     # (accountant, steps) of a report made but not yet committed

    def report(self, privacy, commit=True):
        """This round's report. With ``commit=False`` the steps count as reported only once
        commit() is called (after the result carrying the report was sent), so that a result
        that never left does not hide its steps from the next report."""
        self._pending = None
        if isinstance(privacy, dict):
            return check(privacy)
        accountant = getattr(privacy, "accountant", privacy)
        history = getattr(accountant, "history", None)
        if history is None:
            raise ValueError("privacy must be an Opacus PrivacyEngine (or accountant) or a dict of sample_rate, "
                             "noise_multiplier, steps")
        # Opacus's RDP accountant: a list of (noise_multiplier, sample_rate, num_steps), one
        # entry per run of equal parameters. This round's steps are those after the last report.
        total = sum(int(n) for _, _, n in history)
        reported = self._reported
        if accountant is not self._accountant or total < reported:
            # A new engine (a script may make one each round), or one reset: all its steps are new.
            reported = 0
        new, skip = [], reported
        for sigma, q, n in history:
            n = int(n)
            take = max(0, n - skip)
            skip = max(0, skip - n)
            if take:
                new.append((float(sigma), float(q), take))
        if not new:
            raise ValueError("privacy: the PrivacyEngine took no step since the last report")
        if len({(s, q) for s, q, _ in new}) > 1:
            raise ValueError("privacy: this round's steps ran with more than one (noise multiplier, sample rate); "
                             "report them as one by keeping both fixed within a round")
        sigma, q, _ = new[0]
        clip = getattr(privacy, "max_grad_norm", None)
        report = {"sample_rate": q, "noise_multiplier": sigma, "steps": sum(n for _, _, n in new)}
        if clip is not None:
            report["clip_norm"] = clip
        report = check(report)
        self._pending = (accountant, total)
        if commit:
            self.commit()
        return report

    def commit(self):
        """The last report(commit=False) was sent: its steps are reported."""
        if self._pending is not None:
            self._accountant, self._reported = self._pending
            self._pending = None
