"""The one place that touches private torch / transformers APIs, each behind a fallback.

Mechanism and model code import what they need from here, never a private name directly
(tests/test_compat.py fails if one of the names below disappears from the installed release, so an
upgrade that removes one is noticed before users meet the fallback).
"""

from __future__ import annotations
