"""`PushState` (components/rollout/server/push_state.py): the one owner of the pushes' version and failure flag, read by
``generate`` while a staged push runs on another thread."""

from __future__ import annotations

from components.rollout.server.push_state import PushState


def test_a_failed_push_keeps_its_number_and_a_staged_one_reserves_the_next():
    state = PushState()
    assert state.view().needs_sync and state.next_version() == 1
    state.served(1)
    assert state.next_version() == 2  # a push that fails is sent again under the same number
    state.fail()
    view = state.view()
    assert (view.version, view.failed, view.needs_sync) == (1, True, False)
    assert state.next_version(staged=True) == 2 and state.next_version(staged=True) == 3  # two staged, in order
    state.served(3)
    state.served(2)  # a late answer never takes the version back
    assert state.view() == type(view)(3, False, False)
    state.fresh_servers()
    assert state.view().needs_sync
