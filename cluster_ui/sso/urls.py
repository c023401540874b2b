from django.urls import path

from cluster_ui.sso import views

app_name = "sso"

urlpatterns = [
    path("oidc/authenticate/", views.SignInView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", views.CallbackView.as_view(), name="oidc_authentication_callback"),
]
