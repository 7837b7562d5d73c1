"""URLs in log lines: passwords masked; the file behind a SQLite URL."""
import os

from reid_engine.utils.urls import mask_password, sqlite_file


def test_mask_password_in_urls_and_in_messages_quoting_them():
    assert mask_password("postgresql+psycopg://me:s3cret@db:5432/x") == "postgresql+psycopg://me:***@db:5432/x"
    assert mask_password("postgresql+psycopg://me:pw@/x?host=/tmp/s") == "postgresql+psycopg://me:***@/x?host=/tmp/s"
    message = "could not connect to http://user:pw@127.0.0.1:9 and https://a:b@c/d"
    assert mask_password(message) == "could not connect to http://user:***@127.0.0.1:9 and https://a:***@c/d"
    for unchanged in ("sqlite:////tmp/x.db", "postgresql://db:5432/x", "http://host/path?a=b@c", "no url"):
        assert mask_password(unchanged) == unchanged


def test_sqlite_file_of_sqlite_urls_only(tmp_path):
    assert sqlite_file(f"sqlite:///{tmp_path}/a/study.db") == str(tmp_path / "a" / "study.db")
    assert sqlite_file(f"sqlite+pysqlite:///{tmp_path}/s.db?timeout=5") == str(tmp_path / "s.db")
    assert sqlite_file("sqlite:///rel.db") == os.path.abspath("rel.db")
    for other in ("sqlite:///:memory:", "sqlite://", "postgresql://db/x", "http://h/sqlite:///x"):
        assert sqlite_file(other) is None
