"""asyncflow._errors: the public error classes print, and pickle, as ``asyncflow.X``."""

from __future__ import annotations

import pickle
import traceback

import pytest

import asyncflow
from asyncflow import _errors


@pytest.mark.parametrize("name", _errors.__all__)
def test_public_errors_are_named_by_their_public_path(name: str) -> None:
    cls = getattr(_errors, name)
    assert cls.__module__ == "asyncflow" and getattr(asyncflow, name) is cls


def test_a_traceback_shows_the_public_name() -> None:
    # issue 25.13: errors printed as asyncflow._errors.DecodeError
    text = "".join(traceback.format_exception_only(asyncflow.DecodeError("cannot decode x")))
    assert text == "asyncflow.DecodeError: cannot decode x\n"


def test_errors_still_pickle() -> None:
    for exc in (asyncflow.SourceNotFound("gone"), asyncflow.DecodeError("bad"),
                asyncflow.FailureBudgetExceeded("over", stage="decode")):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)
    group = pickle.loads(pickle.dumps(asyncflow.PipelineError("failed", [ValueError("v")])))
    assert type(group) is asyncflow.PipelineError
