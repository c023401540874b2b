"""The inventory's pages. Their names are not namespaced (``heatmap``, ``nodes``, ``node``): the
navigation, the job pages and the scripts link to them by these names."""

from django.urls import path

from monitoring import views

urlpatterns = [
    path("heatmap/", views.heatmap, name="heatmap"),
    path("nodes/", views.nodes, name="nodes"),
    path("nodes/<str:name>/", views.node_detail, name="node"),
]
