"""The repair thread across fork(): a child starts its own, whatever the parent's held."""

from __future__ import annotations

import multiprocessing

from django_mcpatterns.core.client.repairs import Repairer
from tests import forked
from tests.harness import PATIENCE


class Done:
    """A repairable with nothing left to repair."""

    def repair_round(self) -> bool:
        return False


def _wake_and_wait(repairer: Repairer) -> None:
    forked.dump_stacks_on_signal()
    repairer.wake(Done())
    assert repairer.idle.wait(PATIENCE)  # the child's own thread ran a round


def test_a_child_forked_inside_the_repair_threads_event_can_wake_its_own() -> None:
    """Forked while the parent's repair thread was inside ``idle.set()`` (its event's lock
    held): the child's first wake neither waits for that lock nor for that thread."""
    repairer = Repairer()
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_wake_and_wait, args=(repairer,))
    with repairer.idle._cond:  # as the parent's thread holds it for an instant
        child.start()
    forked.join(child, PATIENCE)
    assert child.exitcode == 0
