"""The one exception hierarchy: every type round-trips through pickle (a child process raises
it to its parent) and maps to the status code its name says."""

from __future__ import annotations

import inspect
import pickle

import grpc
import pytest

import dloader.errors as E

TYPES = [t for _, t in inspect.getmembers(E, inspect.isclass) if issubclass(t, E.DLoaderError)]


def _example(t: type[E.DLoaderError]) -> E.DLoaderError:
    if issubclass(t, E.RequestError):
        return t("job.job_id", "'x' is bad")
    if t is E.WorkerDiedError:
        return t("DataLoader worker (pid(s) 12) exited unexpectedly: SIGKILL", (12,))
    return t("something named")


def test_every_error_is_exported_and_rooted() -> None:
    assert {t.__name__ for t in TYPES} == set(E.__all__) - {
        "MAX_MESSAGE_CHARS",
        "finite_within",
        "shown",
    }
    assert all(issubclass(t, E.DLoaderError) for t in TYPES)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.__name__)
def test_round_trips_through_pickle(t: type[E.DLoaderError]) -> None:
    exc = _example(t)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is t and str(back) == str(exc) and back.args == exc.args
    assert back.__dict__ == exc.__dict__


def test_request_errors_name_a_real_status_code() -> None:
    for t in TYPES:
        if issubclass(t, E.RequestError):
            assert grpc.StatusCode[t.code].name == t.code
    assert E.InvalidArgument("f", "m").code == "INVALID_ARGUMENT"
    assert issubclass(E.InvalidArgument, ValueError)
    assert issubclass(E.WorkerDiedError, RuntimeError)
