import pytest

from workers.rundir.records import Request
from workers.rundir.requests import RequestLog, describe


def test_requests_are_served_once_in_order_and_an_owner_skips_old_ones(tmp_path):
    window, owner = RequestLog(tmp_path), RequestLog(tmp_path)
    window.send("pause")
    owner.skip_old()  # an owner starting the run: an earlier owner's requests are not its own
    assert owner.receive() == []
    window.send("checkpoint")
    window.send("remove_worker", worker=2)
    with open(window.path, "a") as f:
        f.write('not json\n{"action": "format_disk"}\n{"action": "stop"')  # last: unfinished
    got = owner.receive()
    assert [r.action for r in got] == ["checkpoint", "remove_worker"]
    assert got[1].worker == 2 and got[0].time > 0 and got[0].worker is None
    assert owner.skipped == 2  # the line that is not JSON, and the unknown action
    assert owner.receive() == []  # each served once
    with open(window.path, "a") as f:
        f.write("}\n")  # the unfinished line completes: now it is served
    assert [r.action for r in owner.receive()] == ["stop"]
    with pytest.raises(ValueError, match="unknown request"):
        window.send("format_disk")


def test_served_requests_read_as_one_line():
    assert describe(Request(action="remove_worker", worker=2)) == "remove worker 2: done"
    assert describe(Request(action="pause", error="no")) == "pause: refused: no"
