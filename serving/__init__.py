"""HTTP and HTTPS serving that no client can stall, shared by every server of the project.

May import: nothing of the project (the standard library, gunicorn and Flask only), so
every server can use it: the extender (:mod:`scheduler`), the webhook (:mod:`webhook`),
the node agent (:mod:`nodeagent`) and their commands (:mod:`gpupack`).

Listeners (the extender's gunicorn worker, the webhook's, the metrics ports and the node
agent's): a connection is read by one event-loop thread, without blocking, until its
whole request (TLS handshake, head and body) is in, under a deadline; only then does a
request thread see it. Slow, half-open and idle clients therefore hold a socket and a
bounded buffer, never a thread; the number of connections per listener is capped, the
oldest idle or unfinished one making room for a new one; health paths are answered by
their own thread, so they answer while every request thread is busy.

Pure parts (:mod:`serving.head`) are separate from the socket code
(:mod:`serving.gate`, :mod:`serving.listener`, :mod:`serving.gunicorn_worker`). HTTPS
(:mod:`serving.https`: under gunicorn, or in a thread beside another server) takes each
connection's certificate from :mod:`serving.tls`, reloaded when its files change. The
metrics endpoint and its authorization: :mod:`serving.metrics_app`,
:mod:`serving.metrics_auth`.
"""
