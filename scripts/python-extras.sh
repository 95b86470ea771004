#!/usr/bin/env bash
# The optional Python packages that some tests and docs use: tensorboard (its event reader reads
# back the event files of report.tensorboard) and mlflow-skinny (xsilo_client.tracking). They go
# into a venv at .venv-extras (or $XSILO_EXTRAS_VENV) that also sees Debian's numpy and torch;
# tests find it there (or through XSILO_EXTRAS_PYTHON) and skip, saying so, without it. Needs
# PyPI; a failure leaves the tests skipping and says why, it does not fail the caller.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${XSILO_EXTRAS_VENV:-.venv-extras}
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv" || { echo "python-extras: cannot create $venv" >&2; exit 0; }
fi
if "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "tensorboard>=2.10" "mlflow-skinny>=2.0"; then
  echo "python-extras: tensorboard and mlflow-skinny in $venv" >&2
else
  echo "python-extras: could not install tensorboard / mlflow-skinny into $venv (no PyPI?); the tests that need them skip" >&2
fi
