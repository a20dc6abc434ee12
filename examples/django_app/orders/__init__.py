"""The example's one Django app: orders, the stock they draw on, and the task that fulfils
them."""
