// scripts/services.sh compiles this once into the cache with the jars of pom.xml.
//
// Apache Iceberg's REST catalog fixture (org.apache.iceberg.rest.RESTCatalogServer) as its
// start() runs it -- the backend catalog from the CATALOG_* environment, the REST servlet in
// front of it, gzip -- but listening on one address (-Drllm.rest.host) instead of all of them.
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.Map;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.apache.iceberg.util.PropertyUtil;
import org.eclipse.jetty.compression.gzip.GzipCompression;
import org.eclipse.jetty.compression.server.CompressionHandler;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

public class RllmIcebergRest {
  public static void main(String[] args) throws Exception {
    String host = System.getProperty("rllm.rest.host", "127.0.0.1");
    // RESTCatalogServer.initializeBackendCatalog() (private): the catalog and its configuration.
    Class<?> serverClass = Class.forName("org.apache.iceberg.rest.RESTCatalogServer");
    Constructor<?> newServer = serverClass.getDeclaredConstructor();
    newServer.setAccessible(true);
    Method init = serverClass.getDeclaredMethod("initializeBackendCatalog");
    init.setAccessible(true);
    Object context;
    try {
      context = init.invoke(newServer.newInstance());
    } catch (InvocationTargetException e) {
      throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
    }
    Method configuration = context.getClass().getDeclaredMethod("configuration");
    configuration.setAccessible(true);
    @SuppressWarnings("unchecked")
    Map<String, String> conf = (Map<String, String>) configuration.invoke(context);
    int port = PropertyUtil.propertyAsInt(conf, "rest.port", 8181);
    Class<?> adapterClass = Class.forName("org.apache.iceberg.rest.RESTServerCatalogAdapter");
    Constructor<?> newAdapter = adapterClass.getDeclaredConstructor(context.getClass());
    newAdapter.setAccessible(true);
    RESTCatalogAdapter adapter = (RESTCatalogAdapter) newAdapter.newInstance(context);

    // RESTCatalogServer.start(), with a connector of our own.
    ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    handler.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    CompressionHandler compression = new CompressionHandler();
    compression.putCompression(new GzipCompression());
    handler.insertHandler(compression);
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(host);
    connector.setPort(port);
    server.addConnector(connector);
    server.setHandler(handler);
    server.setStopAtShutdown(true);
    server.start();
    server.join();
  }
}
