"""Swagger UI is served from our own static files: clusters are often offline."""


def test_swagger_ui_loads_without_a_cdn(client, django_user_model):
    user = django_user_model.objects.create_user("reader", password="pw")
    client.force_login(user)
    page = client.get("/api/swagger/").content.decode()
    assert "swagger-ui" in page
    assert "cdn" not in page.lower() and "unpkg" not in page.lower()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in page
