"""Build hooks of the docs site (``mkdocs.yml`` names this file twice).

As a MkDocs hook it makes the repository's own Markdown files pages of the
site, so that each is written once: ``README.md`` is the home page,
``CONTRIBUTING.md`` and ``benchmarks/README.md`` pages of their own. Links
are written as the repository shows them on GitHub (``docs/envs.md`` from the
README, ``../CONTRIBUTING.md`` from a page in ``docs/``); each page's links are
rewritten to the site's paths, and a link to a file that is neither a page
nor an image stays as written, which ``mkdocs build --strict`` reports.

As a Griffe extension (:class:`SphinxRoles`) it turns the docstrings' Sphinx
roles (``:class:`~agentgym.rollout.source.RolloutSource```) into links of the
API reference, or into plain code where the target has no page.
"""

from __future__ import annotations

import posixpath
import re
from functools import partial
from pathlib import Path
from typing import Any

import griffe
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]

INCLUDED = {
    "README.md": "index.md",
    "CONTRIBUTING.md": "contributing.md",
    "benchmarks/README.md": "benchmark_suites.md",
}
"""Repository files that are pages too: their path → the page's path in the site."""

_LINK = re.compile(r"(\]\(|(?<=\s)src=\")([^)\"\s]+)")
_ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|data|obj|exc):`(~?)([\w.]+)(?:\(\))?`")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for source, page in INCLUDED.items():
        content = (ROOT / source).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=content))
    return files


def repository_path(page: Page) -> str:
    """Where the page's Markdown lives in the repository."""
    site = page.file.src_uri
    return next((repo for repo, path in INCLUDED.items() if path == site), f"docs/{site}")


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, **kwargs: Any) -> str:
    here = posixpath.dirname(repository_path(page))
    # Markdown links are relative to the page's file (MkDocs turns them into URLs);
    # raw HTML's src="..." is left as it is, so it must be relative to the page's URL.
    relative_to = {
        "](": posixpath.dirname(page.file.src_uri),
        'src="': page.url.rstrip("/") if page.url.endswith("/") else posixpath.dirname(page.url),
    }

    def to_site(match: re.Match[str]) -> str:
        opener, target = match.groups()
        path, hash_, fragment = target.partition("#")
        if not path or re.match(r"[a-z]+:", path) or path.startswith("/"):
            return match[0]
        repo = posixpath.normpath(posixpath.join(here, path))
        site = INCLUDED.get(repo) or (repo[len("docs/") :] if repo.startswith("docs/") else None)
        if site is None:
            return match[0]
        return opener + posixpath.relpath(site, relative_to[opener] or ".") + hash_ + fragment

    return _LINK.sub(to_site, markdown)


class SphinxRoles(griffe.Extension):
    """``:class:`~a.b.C``` → a link to ``a.b.C`` titled ``C`` (``optional``: plain code
    where the API reference has no such object); names without a module are
    resolved in the docstring's own scope."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _ROLE.sub(partial(autoref, obj), obj.docstring.value)


def walk(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found += walk(member)  # type: ignore[arg-type]
    return found


def autoref(obj: griffe.Object, match: re.Match[str]) -> str:
    _, short, name = match.groups()
    head, _, rest = name.partition(".")
    try:
        identifier = obj.resolve(head) + (f".{rest}" if rest else "")
    except (griffe.NameResolutionError, ValueError):
        identifier = name
    title = name.rsplit(".", 1)[-1] if short else name
    return f"<autoref identifier={identifier!r} optional><code>{title}</code></autoref>"
