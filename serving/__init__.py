"""HTTP listeners that no client can stall.

Shared by every server of the project (the extender's gunicorn worker, the webhook's,
the metrics ports and the node agent's): a connection is read by one event-loop thread,
without blocking, until its whole request (TLS handshake, head and body) is in, under a
deadline; only then does a request thread see it. Slow, half-open and idle clients
therefore hold a socket and a bounded buffer, never a thread; the number of connections
per listener is capped, the oldest idle or unfinished one making room for a new one;
health paths are answered by their own thread, so they answer while every request
thread is busy.

Pure parts (:mod:`serving.head`) are separate from the socket code
(:mod:`serving.gate`, :mod:`serving.listener`, :mod:`serving.gunicorn_worker`). This
package imports nothing of the project, so every server can use it.
"""
