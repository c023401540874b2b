"""What the CLI tests share: run ``colony`` in-process, and point it at the live test server."""

from rest_framework.authtoken.models import Token

from cluster_ui.cli.main import main


def run(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``colony ARGV``."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def point_at(monkeypatch, tmp_path, url: str, user) -> None:
    """The CLI talks to ``url`` as ``user``, with no config file of the developer's."""
    monkeypatch.setenv("COLONY_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("COLONY_URL", url)
    monkeypatch.setenv("COLONY_TOKEN", Token.objects.create(user=user).key)
