"""prismbench.files: a result file is written whole or not at all, like any file the user makes."""

from prismbench.files import write_atomically


def test_a_result_gets_the_permissions_a_plain_write_would_give(tmp_path):
    # the temporary file is private (mkstemp: 0600); the result must not stay so
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    written = write_atomically(tmp_path / "new" / "t.json", lambda tmp: tmp.write_text("{}"))
    assert written.stat().st_mode == plain.stat().st_mode

