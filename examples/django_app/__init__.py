"""A Django project that enqueues forklift jobs in the request's own transaction.

`POST /orders` with `{"item": "apple", "quantity": 2}` inserts an order, enqueues the job
that fulfils it, and reserves the stock, all in one `transaction.atomic()` block: the job
is inserted on the very psycopg connection under Django's (`orders/views.py`), so the
order, the job and the reservation commit together, or (out of stock, any error) none of
them does. A worker runs `fulfil_order` (`orders/tasks.py`), which marks the order
fulfilled in the transaction that completes the job. `GET /orders/<id>` shows the order.

Django and forklift share one database, FORKLIFT_DATABASE_URL (Django's DATABASES is
built from it in `settings.py`, and the forklift App's DSN from DATABASES), and one
schema, FORKLIFT_SCHEMA: Django's tables live beside forklift's, so the example writes
into nobody else's. Django needs a database URL: forklift alone, with none, would use the
project's development database under ./.forklift, which Django knows nothing of. From the
repository root:

    export FORKLIFT_DATABASE_URL=postgresql://localhost/mydb FORKLIFT_SCHEMA=shop
    .venv/bin/forklift migrate                                   # forklift's tables first
    .venv/bin/python -m examples.django_app.manage migrate       # then Django's
    .venv/bin/python -m examples.django_app.manage stock apple 10
    .venv/bin/python -m examples.django_app.manage runserver     # terminal 1
    .venv/bin/forklift run examples.django_app.worker:app        # terminal 2: the workers
    curl -si -d '{"item": "apple", "quantity": 2}' localhost:8000/orders
    curl -si localhost:8000/orders/1
"""
