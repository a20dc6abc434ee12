"""A web producer: HTTP -> a row and its job in one transaction -> the worker pool.

`POST /thumbnails` with `{"name": "cat.png", "size": 128}` inserts a row in the app's own
table and enqueues the job that renders it, in the request's own transaction: both commit
or neither does. A worker renders the thumbnail (CPU-bound, ~50-100 ms at size 128) and
stores the render in the transaction that completes the job; `GET /thumbnails/<id>`
answers from the row and the job's state (202 while pending, 200 with the result, 500 if
it went dead). SIGTERM stops the web process gracefully: it stops accepting, finishes the
requests in flight, then exits. Everything lives in the app's schema (FORKLIFT_SCHEMA).
From the repository root:

    export FORKLIFT_DATABASE_URL=postgresql://localhost/mydb FORKLIFT_SCHEMA=web
    .venv/bin/python -m examples.web --addr 127.0.0.1:8000     # terminal 1: migrates, serves
    .venv/bin/forklift run examples.web.app:app --workers 2    # terminal 2: the workers
    curl -si -d '{"name": "cat.png", "size": 128}' localhost:8000/thumbnails
    curl -si localhost:8000/thumbnails/1

`app.py` is what both processes import (the tables, the task); `server.py` is the web
side, on the standard library's wsgiref.
"""
