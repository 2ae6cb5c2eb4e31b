"""The house has the rooms docs/architecture.md names: every module and subpackage at
the top of ``agentgym/``, and every top-level folder of Python source, is named in the
page's "Rooms" section. A new one must find its floor there first."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_ROOMS = {"tests", "benchmarks", "docs", "site", "build", "dist", "outputs"}
"""Top-level folders that are not part of the installed house."""


def rooms_section(page: str) -> str:
    """The text of the page's ``## Rooms`` section."""
    start = page.index("## Rooms")
    end = page.find("\n## ", start + 1)
    return page[start : end if end > 0 else None]


def undocumented(root: Path, page: str) -> list[str]:
    """The top-level modules, subpackages and source folders of ``root`` that the page's
    Rooms section does not name."""
    section = rooms_section(page)
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", section))
    missing = []
    package = root / "agentgym"
    for path in sorted(package.iterdir()):
        if path.is_symlink() or path.name.startswith(("_", ".")):
            continue  # the symlinked rooms are checked as top-level folders below
        if path.suffix == ".py" and path.stem not in words:
            missing.append(f"agentgym/{path.name}")
        elif (
            path.is_dir()
            and (path / "__init__.py").is_file()
            and f"agentgym/{path.name}/" not in section
        ):
            missing.append(f"agentgym/{path.name}/")
    for path in sorted(root.iterdir()):
        if not path.is_dir() or path.name.startswith(".") or path.name in NOT_ROOMS:
            continue
        source = any(path.rglob("*.py")) or path.name == "configs"
        if path.name == "agentgym" or not source:
            continue
        if not re.search(rf"^{re.escape(path.name)}/", section, re.M):
            missing.append(f"{path.name}/")
    return missing


def test_every_room_of_the_house_is_named_in_the_architecture_page() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert undocumented(ROOT, page) == []


def test_a_new_module_outside_the_documented_rooms_is_found(tmp_path: Path) -> None:
    package = tmp_path / "agentgym"
    (package / "builders").mkdir(parents=True)
    (package / "builders" / "__init__.py").write_text("")
    (package / "schema.py").write_text("")
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("")
    page = "# House\n\n## Rooms\n\n```\nenvs/  envs\nagentgym/builders/  schema\n```\n\n## Seams\n"
    assert undocumented(tmp_path, page) == []
    (package / "gadgets.py").write_text("")  # a new module, in no room
    (package / "proxy").mkdir()
    (package / "proxy" / "__init__.py").write_text("")  # a new subpackage
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "client.py").write_text("")  # a new top-level source folder
    assert undocumented(tmp_path, page) == ["agentgym/gadgets.py", "agentgym/proxy/", "remote/"]
