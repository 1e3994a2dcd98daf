import pytest

from tests.support.tinker_service import running_service


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """`lightning-rl serve` on the shipped tiny policy, in this process, for a module's tests (a gap in a client's
    numbers is never waited out: only a refusal that names its number closes it)."""
    with running_service(tmp_path_factory.mktemp("serve"), seq_gap_s=600.0) as server:
        yield server
