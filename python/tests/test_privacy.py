"""What a script reports as `privacy` with its train results (xsilo_client/privacy.py)."""

import unittest

from xsilo_client import privacy


class FakeAccountant:
    """Opacus's RDP accountant as the SDK reads it: (noise_multiplier, sample_rate, steps) runs."""

    def __init__(self):
        self.history = []

    def step(self, sigma, q, n=1):
        if self.history and self.history[-1][:2] == (sigma, q):
            s, rate, m = self.history[-1]
            self.history[-1] = (s, rate, m + n)
        else:
            self.history.append((sigma, q, n))


class FakeEngine:
    def __init__(self):
        self.accountant = FakeAccountant()


class PrivacyReportTest(unittest.TestCase):
    def test_an_engine_reports_the_steps_since_the_last_report(self):
        engine, r = FakeEngine(), privacy.Reporter()
        engine.accountant.step(1.1, 0.02, 50)
        self.assertEqual(r.report(engine), {"sample_rate": 0.02, "noise_multiplier": 1.1, "steps": 50})
        engine.accountant.step(1.1, 0.02, 30)  # merged into the same run by the accountant
        self.assertEqual(r.report(engine)["steps"], 30)
        engine.accountant.step(2.0, 0.02, 10)
        self.assertEqual(r.report(engine), {"sample_rate": 0.02, "noise_multiplier": 2.0, "steps": 10})

    def test_a_new_engine_each_round_reports_all_its_steps(self):
        r = privacy.Reporter()
        first, second = FakeEngine(), FakeEngine()
        first.accountant.step(1.0, 0.1, 100)
        self.assertEqual(r.report(first)["steps"], 100)
        second.accountant.step(1.0, 0.1, 150)
        self.assertEqual(r.report(second)["steps"], 150)

    def test_an_engine_that_took_no_step_or_changed_its_noise_within_a_round_is_refused(self):
        engine, r = FakeEngine(), privacy.Reporter()
        with self.assertRaisesRegex(ValueError, "no step"):
            r.report(engine)
        engine.accountant.step(1.0, 0.1, 5)
        engine.accountant.step(2.0, 0.1, 5)
        with self.assertRaisesRegex(ValueError, "more than one"):
            r.report(engine)

    def test_steps_of_a_report_not_committed_are_reported_again(self):
        # xc.send reports before it writes the weights and commits once the result is sent: a
        # result that never left does not hide its steps from the next round's report.
        engine, r = FakeEngine(), privacy.Reporter()
        engine.accountant.step(1.0, 0.1, 7)
        self.assertEqual(r.report(engine, commit=False)["steps"], 7)
        engine.accountant.step(1.0, 0.1, 3)
        self.assertEqual(r.report(engine, commit=False)["steps"], 10)
        r.commit()
        engine.accountant.step(1.0, 0.1, 2)
        self.assertEqual(r.report(engine)["steps"], 2)

    def test_a_dict_is_checked_and_anything_else_is_refused(self):
        r = privacy.Reporter()
        self.assertEqual(r.report({"sample_rate": 0.5, "noise_multiplier": 1, "steps": 3, "clip_norm": 2}),
                         {"sample_rate": 0.5, "noise_multiplier": 1.0, "steps": 3, "clip_norm": 2.0})
        for bad, what in [({"sample_rate": 0, "noise_multiplier": 1, "steps": 1}, "sample_rate"),
                          ({"sample_rate": 0.1, "noise_multiplier": 0, "steps": 1}, "noise_multiplier"),
                          ({"sample_rate": 0.1, "noise_multiplier": 1, "steps": 0}, "steps"),
                          ({"sample_rate": 0.1, "noise_multiplier": float("nan"), "steps": 1}, "finite"),
                          ({"sample_rate": 0.1, "noise_multiplier": 1, "steps": True}, "steps")]:
            with self.assertRaisesRegex(ValueError, what):
                r.report(bad)
        with self.assertRaisesRegex(ValueError, "PrivacyEngine"):
            r.report(42)


if __name__ == "__main__":
    unittest.main()
