"""A retrieval server that speaks GEM's search protocol, over a local corpus (BM25).

GEM's ``SearchTool`` POSTs ``msgpack({"query", "topk", "return_scores"})`` to its
``search_url`` and reads ``msgpack({"result": [{"document": {"contents"}, "score"},
...]})`` back; GEM's own server (``gem.tools.search_engine.retrieval_server``) answers
from a dense index of wiki-18 and an embedding model. This one answers from a JSONL
corpus (``{title, text}`` or ``{contents}`` rows) with agentgym's BM25 index, so ROLL's
search files run against ``search_url`` as written, on a machine without the index::

    python -m agentgym.envs.gem.retrieval --corpus wiki.jsonl --port 8000
    # search_url: http://localhost:8000/retrieve
"""

from __future__ import annotations

import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from agentgym.envs.gem.tools import read_corpus
from agentgym.envs.tools.search_qa.search import SearchIndex


def make_server(corpus: str, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """The server (not yet serving) for ``corpus`` at ``host:port`` (``/retrieve``).

    Raises:
        ConfigError: If the corpus cannot be read.
    """
    index = SearchIndex(read_corpus(corpus))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name
            if self.path.rstrip("/") != "/retrieve":
                self.send_error(404, "POST /retrieve")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                request: dict[str, Any] = msgspec.msgpack.decode(body) if body else {}
            except msgspec.DecodeError:
                self.send_error(400, "the body is not msgpack")
                return
            query, topk = str(request.get("query", "")), int(request.get("topk", 3))
            found = index.search(query, topk) if query else []
            result = [
                {"document": {"contents": f"{doc.title}\n{doc.text}"}, "score": 1.0 / (rank + 1)}
                for rank, doc in enumerate(found)
            ]
            payload = msgspec.msgpack.encode({"result": result})
            self.send_response(200)
            self.send_header("Content-Type", "application/msgpack")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # the base's name
            """Quiet: one line a request would flood a run's log."""

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> None:
    """Serve a corpus until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus", required=True, help="a JSONL file of {title, text} or {contents}"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server = make_server(args.corpus, args.host, args.port)
    print(f"serving {args.corpus} at http://{args.host}:{args.port}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
