"""Tests of xsilo_client. Run from anywhere:

    python3 -m unittest discover -s python/tests -t python
"""
import os
import sys

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)
