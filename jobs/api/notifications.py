"""The signed-in user's notification settings (filled in by the notifications work)."""

urlpatterns: list = []
