"""The IMDSv2 client against a real HTTP IMDS on loopback, and the pure identity/ENI parsers."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from agent.readers.imds import (
    IDENTITY_PATHS,
    Eni,
    ImdsClient,
    ImdsError,
    ImdsForbidden,
    ImdsNotFound,
    ImdsUnavailable,
    parse_eni,
    parse_identity,
    parse_listing,
    read_enis,
    read_identity,
    sort_enis,
)
from tests.conftest import free_port
from tests.support.imds_server import FakeClock, FakeEni, ImdsServer, metadata_tree

TOKEN = "/latest/api/token"


def test_token_is_required_and_reused() -> None:
    with ImdsServer() as srv:
        with pytest.raises(urllib.error.HTTPError) as err:   # the server really wants a token
            urllib.request.urlopen(f"{srv.url}/latest/meta-data/instance-id", timeout=2)
        assert err.value.code == 401
        c = ImdsClient(srv.url, timeout=1.0)
        assert c.get("meta-data/instance-id") == "i-0123456789abcdef0"
        assert c.get("meta-data/instance-type") == "m5.large"
        assert c.get("meta-data/placement/region") == "us-east-1"
        assert srv.token_puts == 1
        assert srv.token_ttls == [21600]
        assert all(r.had_token for r in srv.requests if r.method == "GET" and r.status == 200)
        assert c.stats.version == "v2"
        assert c.stats.snapshot()[("token", "ok")] == 1
        assert c.stats.snapshot()[("metadata", "ok")] == 3


def test_token_ttl_is_honoured_and_renewed_before_expiry() -> None:
    clock = FakeClock()
    with ImdsServer(clock=clock) as srv:
        c = ImdsClient(srv.url, timeout=1.0, token_ttl=100, clock=clock)
        c.get("meta-data/instance-id")
        clock.advance(85)                     # inside the TTL minus the 10 % margin: same token
        c.get("meta-data/instance-id")
        assert srv.token_puts == 1
        clock.advance(6)                      # 91 s: within 10 s of expiry, so a new token first
        c.get("meta-data/instance-id")
        assert srv.token_puts == 2
        assert srv.token_ttls == [100, 100]
        assert srv.count("GET", status=401) == 0


def test_server_expires_tokens_after_their_ttl() -> None:
    server_clock, client_clock = FakeClock(), FakeClock()
    with ImdsServer(clock=server_clock) as srv:
        c = ImdsClient(srv.url, timeout=1.0, token_ttl=60, clock=client_clock)
        c.get("meta-data/instance-id")
        server_clock.advance(61)              # IMDS's view: expired; the client still trusts its token
        assert c.get("meta-data/instance-id") == "i-0123456789abcdef0"
        assert srv.count("GET", status=401) == 1
        assert srv.token_puts == 2


def test_401_fetches_a_new_token_once() -> None:
    with ImdsServer() as srv:
        c = ImdsClient(srv.url, timeout=1.0)
        c.get("meta-data/instance-id")
        srv.expire_tokens()
        assert c.get("meta-data/instance-type") == "m5.large"
        assert srv.token_puts == 2
        assert srv.count("GET", status=401) == 1
        srv.reject_tokens = True              # a 401 that a new token does not cure: no loop
        with pytest.raises(ImdsError, match="401"):
            c.get("meta-data/instance-id")
        assert srv.token_puts == 3
        assert c.stats.snapshot()[("metadata", "unauthorized")] == 3


def test_disabled_imds_answers_403_without_retries() -> None:
    with ImdsServer(disabled=True) as srv:
        c = ImdsClient(srv.url, timeout=1.0, retries=2)
        with pytest.raises(ImdsForbidden):
            c.get("meta-data/instance-id")
        assert len(srv.requests) == 1
        with pytest.raises(ImdsForbidden):    # remembered: no second round trip
            c.get("meta-data/instance-id")
        assert len(srv.requests) == 1
        p = c.probe()
        assert (p.reachable, p.imdsv2) == (True, False) and "disabled" in p.detail


def test_slow_imds_within_the_timeout_works() -> None:
    with ImdsServer(delay=0.1) as srv:
        c = ImdsClient(srv.url, timeout=1.0, retries=0)
        assert c.get("meta-data/instance-id") == "i-0123456789abcdef0"


@pytest.mark.parametrize("mode", ["delay", "hang"])
def test_slow_or_dead_imds_gives_up_after_bounded_attempts(mode: str) -> None:
    knobs = {"delay": 2.0} if mode == "delay" else {"hang": True}
    with ImdsServer(**knobs) as srv:  # type: ignore[arg-type]
        c = ImdsClient(srv.url, timeout=0.2, retries=2)
        t0 = time.monotonic()
        with pytest.raises(ImdsUnavailable, match="timed out"):
            c.get("meta-data/instance-id")
        elapsed = time.monotonic() - t0
        # The server logs a request when its handler thread gets to it, which on a loaded machine can be
        # after the client already timed out: wait for the count to settle, then it must be exactly 3.
        settle = time.monotonic() + 2.0
        while srv.count("PUT") < 3 and time.monotonic() < settle:
            time.sleep(0.02)
        assert srv.count("PUT") == 3                      # 1 + retries, then it stops
        # 3 timeouts of 0.2 s plus 0.1 + 0.2 s of backoff; generous slack for a loaded CI machine
        assert 0.6 <= elapsed < 3.0
        with pytest.raises(ImdsUnavailable):              # the verdict sticks: no new attempts
            c.get("meta-data/instance-type")
        # The client's own count of attempts (updated before it returns) shows no new one: no race with the
        # server's log, and no time bound needed.
        assert c.stats.snapshot()[("token", "timeout")] == 3 and srv.count("PUT") == 3
        assert c.stats.up is False
        c.reset()                                         # a later re-probe tries again
        srv.delay, srv.hang = 0.0, False
        assert c.get("meta-data/instance-id") == "i-0123456789abcdef0"


def test_refused_endpoint_fails_fast() -> None:
    port = free_port()
    c = ImdsClient(f"http://127.0.0.1:{port}", timeout=1.0, retries=2)
    t0 = time.monotonic()
    with pytest.raises(ImdsUnavailable, match="refused"):
        c.get("meta-data/instance-id")
    assert time.monotonic() - t0 < 1.5                    # refusals cost only the 0.1 + 0.2 s backoff
    assert c.stats.snapshot() == {("token", "refused"): 3}
    p = c.probe()
    assert not p.reachable and "hop-limit" in p.detail


def test_server_errors_are_retried() -> None:
    with ImdsServer(fail_next=2) as srv:
        c = ImdsClient(srv.url, timeout=1.0, retries=2)
        assert c.get("meta-data/instance-id") == "i-0123456789abcdef0"
        assert srv.count("PUT", status=500) == 2 and srv.token_puts == 1
    with ImdsServer(fail_next=5) as srv:
        c = ImdsClient(srv.url, timeout=1.0, retries=1)
        with pytest.raises(ImdsUnavailable, match="HTTP 500"):
            c.get("meta-data/instance-id")
        assert srv.count("PUT") == 2


def test_missing_path_is_not_found() -> None:
    with ImdsServer() as srv:
        c = ImdsClient(srv.url, timeout=1.0)
        with pytest.raises(ImdsNotFound):
            c.get("meta-data/no-such-key")
        assert srv.count("GET", status=404) == 1          # 404 is an answer, not a reason to retry
        assert c.stats.up is True


def test_imdsv1_only_when_allowed() -> None:
    # An instance whose token PUT answer never arrives (hop limit 1 from a container), tokens optional.
    with ImdsServer(token_hang=True, require_token=False) as srv:
        strict = ImdsClient(srv.url, timeout=0.2, retries=0)
        with pytest.raises(ImdsUnavailable):
            strict.get("meta-data/instance-id")
        assert srv.count("GET") == 0                      # never a token-less read unless allowed
        v1 = ImdsClient(srv.url, timeout=0.2, retries=0, allow_imdsv1=True)
        assert v1.get("meta-data/instance-id") == "i-0123456789abcdef0"
        assert v1.get("meta-data/instance-type") == "m5.large"
        assert v1.stats.version == "v1"
        assert srv.count("PUT") == 2                      # one per client: v1 is then remembered
        assert not any(r.had_token for r in srv.requests if r.method == "GET")
    # With http-tokens=required, IMDSv1 cannot help.
    with ImdsServer(token_hang=True, require_token=True) as srv:
        v1 = ImdsClient(srv.url, timeout=0.2, retries=0, allow_imdsv1=True)
        with pytest.raises(ImdsUnavailable):
            v1.get("meta-data/instance-id")


def test_ipv6_endpoint() -> None:
    with ImdsServer(host="::1") as srv:
        assert srv.url.startswith("http://[::1]:")
        c = ImdsClient(srv.url, timeout=1.0)
        assert c.get("meta-data/instance-id") == "i-0123456789abcdef0"
        assert c.probe() == (True, True, f"IMDSv2 at {srv.url}: instance i-0123456789abcdef0")


def test_probe_does_not_disturb_the_cached_token() -> None:
    with ImdsServer() as srv:
        c = ImdsClient(srv.url, timeout=1.0)
        c.get("meta-data/instance-id")
        assert c.probe().imdsv2
        c.get("meta-data/instance-id")
        assert srv.token_ttls == [21600, 60]              # the probe's own short-lived token


def test_probe_can_reuse_what_the_client_already_knows() -> None:
    with ImdsServer(hang=True) as srv:
        c = ImdsClient(srv.url, timeout=0.2, retries=0)
        with pytest.raises(ImdsUnavailable):
            c.get("meta-data/instance-id")
        p = c.probe(reuse=True)
        assert not p.reachable and srv.count("PUT") == 1   # answered from what it knew: no new attempt,
        assert c.stats.snapshot()[("token", "timeout")] == 1   # so no timeout was waited out again
    with ImdsServer() as srv:
        c = ImdsClient(srv.url, timeout=1.0)
        assert c.probe(reuse=True).imdsv2 and srv.count("PUT") == 1     # nothing known yet: asks
        c.get("meta-data/instance-id")
        seen = len(srv.requests)
        assert c.probe(reuse=True) == (True, True, f"IMDSv2 at {srv.url} (token reads succeeded)")
        assert len(srv.requests) == seen


def test_bad_endpoint_is_rejected() -> None:
    with pytest.raises(ValueError):
        ImdsClient("https://169.254.169.254")
    with pytest.raises(ValueError):
        ImdsClient("169.254.169.254")


def test_read_identity_and_enis_from_the_server() -> None:
    enis = (FakeEni("0a:1b:2c:3d:4e:02", device_number=1, interface_id="eni-2", local_ipv4s=("10.0.2.5",)),
            FakeEni("0a:1b:2c:3d:4e:01", device_number=0, interface_id="eni-1", network_card_index=None,
                    vpc_cidrs=("10.0.0.0/16", "100.64.0.0/16"), local_ipv4s=("10.0.1.23", "10.0.1.24")))
    tree = metadata_tree(instance_type="c6in.32xlarge", region=None, availability_zone_id=None, enis=enis)
    with ImdsServer(tree) as srv:
        c = ImdsClient(srv.url, timeout=1.0)
        ident = parse_identity(read_identity(c))
        raw = read_enis(c)
    assert ident == ("i-0123456789abcdef0", "c6in.32xlarge", "us-east-1", "us-east-1a", None)
    parsed = sort_enis([parse_eni(mac, v) for mac, v in raw.items()])
    assert [e.interface_id for e in parsed] == ["eni-1", "eni-2"]
    assert parsed[0] == Eni("0a:1b:2c:3d:4e:01", 0, 0, "eni-1", "subnet-0123456789abcdef0",
                            "vpc-0123456789abcdef0", ("10.0.0.0/16", "100.64.0.0/16"),
                            ("10.0.1.23", "10.0.1.24"))
    assert "network-card-index" not in raw["0a:1b:2c:3d:4e:01"]


# -- pure parsers on captured text ------------------------------------------------------------------

def test_parse_listing() -> None:
    macs = "0a:1b:2c:3d:4e:01/\n0a:1b:2c:3d:4e:02/\n"
    assert parse_listing(macs) == ["0a:1b:2c:3d:4e:01", "0a:1b:2c:3d:4e:02"]
    assert parse_listing("") == []
    assert parse_listing("10.0.1.23\n10.0.1.24") == ["10.0.1.23", "10.0.1.24"]


@pytest.mark.parametrize(("values", "expected"), [
    ({"instance_id": "i-1", "instance_type": "t3.micro", "region": "eu-west-1",
      "availability_zone": "eu-west-1b", "availability_zone_id": "euw1-az3"},
     ("i-1", "t3.micro", "eu-west-1", "eu-west-1b", "euw1-az3")),
    ({"instance_id": "i-2\n", "instance_type": " m5.large ", "availability_zone": "us-west-2c"},
     ("i-2", "m5.large", "us-west-2", "us-west-2c", None)),          # old IMDS: region from the AZ
])
def test_parse_identity(values: dict[str, str], expected: tuple) -> None:
    assert parse_identity({IDENTITY_PATHS[k]: v for k, v in values.items()}) == expected


def test_parse_identity_needs_id_and_type() -> None:
    with pytest.raises(ValueError):
        parse_identity({IDENTITY_PATHS["instance_id"]: "i-1"})


def test_parse_eni_fallbacks() -> None:
    e = parse_eni("0A:1B:2C:3D:4E:09", {"device-number": "2", "vpc-ipv4-cidr-block": "172.31.0.0/16",
                                        "network-card-index": "1", "local-ipv4s": "172.31.5.6\n"})
    assert e == Eni("0a:1b:2c:3d:4e:09", 2, 1, None, None, None, ("172.31.0.0/16",), ("172.31.5.6",))
    assert parse_eni("0a:1b:2c:3d:4e:09", {"device-number": "x"}).device_number is None


def test_sort_enis_puts_the_primary_first() -> None:
    a = Eni("aa", 1, 0, "a", None, None, (), ())
    b = Eni("bb", 0, 1, "b", None, None, (), ())
    c = Eni("cc", 0, 0, "c", None, None, (), ())
    assert [e.interface_id for e in sort_enis([a, b, c])] == ["c", "a", "b"]
