"""The example's URLs."""

from __future__ import annotations

from django.urls import path

from examples.django_app.orders import views

urlpatterns = [
    path("orders", views.create_order),
    path("orders/after-commit", views.create_order_on_commit),
    path("orders/<int:order_id>", views.show_order),
]
