"""`python -m examples.django_app.manage stock ITEM COUNT`."""
