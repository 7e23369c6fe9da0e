"""``specdec serve``: an HTTP server over the request-level engine.

OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (streaming included), Triton's
``/v2/models/{model}/generate``, ``/health`` and Prometheus ``/metrics`` with vLLM's metric names.
It needs the ``serve`` extra (``pip install 'specdec[serve]'``); :func:`specdec.server.app.create_app`
builds the ASGI app.
"""
